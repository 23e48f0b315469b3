mod support;

mod escape;
mod exec;
mod race;
mod tools;
