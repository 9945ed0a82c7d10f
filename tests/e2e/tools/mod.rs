//! The tools: `bench`, `sim`, `plan`, `report` and the simulator's refusals.

mod tools_cli;
mod sim_refusals;
