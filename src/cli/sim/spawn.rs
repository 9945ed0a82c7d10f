//! `infergate sim --engine-args-from-config`: the engine settings of a gateway config's pool,
//! read from its `spawn` entries (the flags `infergate up` passes to `infergate engine`), so that
//! a scenario's engines are configured in one place and the simulation runs what `up` would
//! start. The flags are parsed by the engine's own parser; what the simulator models of them is
//! applied to [`SimConfig`].

use clap::Parser;
use infergate_engine::args::{BackendKind, EngineArgs};
use infergate_engine::host_time::HostCost;

use super::SimConfig;
use infergate::config::{PoolSpec, WorkerSource};

/// `infergate engine`'s flags, parsed as the engine parses them.
#[derive(Parser)]
struct EngineCli {
    #[command(flatten)]
    engine: EngineArgs,
}

/// The pool's sim engines: how many `up` spawns, and their flags. Every sim `spawn` entry of the
/// pool must name the same flags (one engine configuration per simulated fleet).
pub(super) fn pool_engines(pool: &PoolSpec) -> Result<(usize, EngineArgs), String> {
    let mut found: Option<(usize, &Vec<String>, EngineArgs)> = None;
    for source in &pool.workers {
        let WorkerSource::Spawn { count, args } = source else {
            continue;
        };
        let argv = std::iter::once("engine").chain(args.iter().map(String::as_str));
        let parsed = EngineCli::try_parse_from(argv)
            .map_err(|e| format!("pool {}: spawn args {args:?}: {e}", pool.name))?
            .engine;
        if parsed.backend != BackendKind::Sim {
            continue;
        }
        found = match found {
            None => Some((*count, args, parsed)),
            Some((n, first, e)) if first == args => Some((n + count, first, e)),
            Some(_) => {
                return Err(format!(
                    "pool {}: its sim spawn entries differ in their args; the simulator runs one engine configuration",
                    pool.name
                ));
            }
        };
    }
    found.map(|(n, _, e)| (n, e)).ok_or_else(|| {
        format!(
            "pool {}: no `spawn` entry runs the sim backend (--engine-args-from-config reads one)",
            pool.name
        )
    })
}

/// `cfg` with the engine settings the simulator models taken from `e` and `workers` workers.
pub(super) fn apply(cfg: &mut SimConfig, workers: usize, e: &EngineArgs) {
    cfg.workers = workers;
    cfg.gpu = e.gpu.clone();
    cfg.model = e.model.clone().unwrap_or_else(|| "llama-3-8b".into());
    cfg.tensor_parallel_size = e.tensor_parallel_size;
    cfg.max_num_seqs = e.max_num_seqs;
    cfg.max_num_batched_tokens = e.max_num_batched_tokens.unwrap_or(8192);
    cfg.block_size = e.block_size;
    cfg.gpu_memory_utilization = e.gpu_memory_utilization;
    cfg.chunked_prefill = !e.no_chunked_prefill;
    cfg.prefix_caching = !e.no_prefix_caching;
    cfg.kv_protected_fraction = e.kv_protected_fraction;
    // Our engines publish KV events unless told not to, and the gateway routes on them.
    cfg.kv_events = !e.no_kv_events;
    cfg.num_gpu_blocks_override = e.num_gpu_blocks_override;
    cfg.latency_multiplier = e.fault_latency_multiplier;
    cfg.cuda_graph_sizes.clone_from(&e.cuda_graph_sizes);
    cfg.enforce_eager = e.enforce_eager;
    cfg.cudagraph_mode = e.cudagraph_mode;
    cfg.host_cost = HostCost::from_micros(
        e.sim_host_us_per_step,
        e.sim_host_us_per_seq,
        e.sim_host_us_per_prompt_token,
        e.sim_host_us_per_output_token,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(workers: Vec<WorkerSource>) -> PoolSpec {
        let snapshot = infergate::config::load_default().expect("embedded config");
        let mut p = snapshot.pools[0].clone();
        p.workers = workers;
        p
    }

    fn spawn(count: usize, args: &[&str]) -> WorkerSource {
        WorkerSource::Spawn {
            count,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
        }
    }

    #[test]
    fn sim_spawns_set_the_engines_and_their_count() {
        let args = [
            "--backend",
            "sim",
            "--gpu",
            "l4",
            "--max-num-seqs",
            "8",
            "--no-prefix-caching",
            "--sim-host-us-per-step",
            "20000",
            "--cuda-graph-sizes",
            "1,2,8",
            "--cudagraph-mode",
            "full-and-piecewise",
        ];
        let p = pool(vec![
            spawn(2, &args),
            spawn(1, &["--backend", "cpu"]),
            spawn(1, &args),
            WorkerSource::Url("http://10.0.0.5:8000".into()),
        ]);
        let (n, e) = pool_engines(&p).expect("one configuration");
        let mut cfg = SimConfig::default();
        apply(&mut cfg, n, &e);
        assert_eq!((cfg.workers, cfg.gpu.as_str()), (3, "l4"));
        assert_eq!((cfg.max_num_seqs, cfg.max_num_batched_tokens), (8, 8192));
        assert!(!cfg.prefix_caching && cfg.chunked_prefill && cfg.kv_events);
        assert_eq!(cfg.model, "llama-3-8b");
        assert_eq!(cfg.host_cost, HostCost::from_micros(20000.0, 0.0, 0.0, 0.0));
        assert_eq!(
            (cfg.cuda_graph_sizes.as_slice(), cfg.enforce_eager),
            (&[1, 2, 8][..], false)
        );
        assert_eq!(
            cfg.cudagraph_mode,
            infergate_engine::exec_path::CudagraphMode::FullAndPiecewise
        );
    }

    #[test]
    fn differing_or_missing_sim_spawns_are_errors() {
        let p = pool(vec![
            spawn(1, &["--gpu", "l4"]),
            spawn(1, &["--gpu", "h100"]),
        ]);
        assert!(pool_engines(&p).unwrap_err().contains("differ"));
        let p = pool(vec![spawn(1, &["--backend", "cpu"])]);
        assert!(pool_engines(&p).unwrap_err().contains("no `spawn`"));
        let p = pool(vec![spawn(1, &["--no-such-flag"])]);
        assert!(pool_engines(&p).is_err());
    }
}
