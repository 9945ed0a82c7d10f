//! Routing policy benchmark (being written).
fn main() {}
