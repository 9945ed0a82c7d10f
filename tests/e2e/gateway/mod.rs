//! The gateway against real engines: routing, the explained hit rate, shape classes, failover, streaming, reloads, TLS and admin, DNS discovery, `up`.

mod flight_record;
mod gateway_cpu;
mod gateway_dns;
mod gateway_failover;
mod gateway_hit_rate;
mod gateway_kv_events;
mod gateway_reload;
mod gateway_routing;
mod gateway_streaming;
mod gateway_tls_admin;
mod gateway_up;
mod gateway_vllm_events;
mod gateway_warmup;
mod otlp_export;
mod shape_classes;
