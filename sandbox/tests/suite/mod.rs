mod support;

mod contain;
mod escape;
mod exec;
mod identity;
mod network;
mod processes;
mod race;
mod toolchain;
mod tools;
