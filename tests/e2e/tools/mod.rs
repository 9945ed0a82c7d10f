//! The tools: `bench`, `sim`, `plan`, `report`, `doctor` and the simulator's refusals.

mod doctor;
mod sim_refusals;
mod tools_cli;
