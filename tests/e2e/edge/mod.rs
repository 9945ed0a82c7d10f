//! The client edge: slow, unfinished and malicious clients, connection bursts, the open-file limit, the drain.

mod edge_burst;
mod edge_connections;
mod edge_nofile;
