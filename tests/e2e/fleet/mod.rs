//! Fleet mode: shared limits in Redis and the ledger in PostgreSQL, several replicas.

mod fleet_lease;
mod fleet_postgres;
mod fleet_prefix_homes;
mod fleet_redis;
