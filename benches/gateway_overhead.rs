//! Gateway overhead benchmark (being written).
fn main() {}
