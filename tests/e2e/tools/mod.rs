//! The tools: `bench`, `sim`, `plan`, `report`, `doctor`, `shapes`, replay of a gateway trace, the victims of rare shapes,
//! the five symptoms' scenarios and the simulator's refusals.

mod doctor;
mod doctor_scenarios;
mod rare_shapes;
mod replay;
mod replay_features;
mod scenarios;
mod shapes;
mod sim_refusals;
mod tools_cli;
