//! The tools: `bench`, `sim`, `plan`, `report` and the simulator's refusals.

mod scenarios;
mod sim_refusals;
mod tools_cli;
