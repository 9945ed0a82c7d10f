//! Tenants: keys, tiers, limits, admission, floods, the cost ledger and its dashboard.

mod cost_dashboard;
mod cost_ledger;
mod tenants_admission;
mod tenants_deadline;
mod tenants_fair_share;
mod tenants_flood;
mod tenants_limits;
mod tenants_up;
mod tenants_validation;
