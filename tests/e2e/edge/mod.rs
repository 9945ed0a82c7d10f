//! The client edge under load: connection bursts and the open-file limit.

mod edge_burst;
mod edge_nofile;
