mod support;

mod exec;
