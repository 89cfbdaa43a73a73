//! The command line: what clap reads (`args`) and what each command does with it
//! (`commands`). The library does the work; this prints and picks exit codes.

pub mod args;
pub mod commands;
pub mod plugin;
pub mod render;
pub mod report;
