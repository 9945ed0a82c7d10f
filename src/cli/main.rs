//! The `infergate` binary: one executable, several roles (see `infergate --help`).
#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use infergate::config::LogFormat;
use infergate::up::{RunArgs, load_snapshot};
use infergate_engine::args::EngineArgs;

/// Small, short-lived allocations dominate a proxied request; mimalloc serves them from
/// per-thread pages without the arena locks glibc's malloc takes when another thread frees.
#[global_allocator]
static ALLOCATOR: allocator::Mimalloc = allocator::Mimalloc;

/// mimalloc as the global allocator, asked for ordinary alignments with its plain calls.
#[expect(
    unsafe_code,
    reason = "a global allocator is an unsafe trait over mimalloc's C API"
)]
mod allocator {
    use std::alloc::{GlobalAlloc, Layout};
    use std::ffi::c_void;

    use libmimalloc_sys::{
        mi_free, mi_malloc, mi_malloc_aligned, mi_realloc, mi_realloc_aligned, mi_zalloc,
        mi_zalloc_aligned,
    };

    /// The alignment `mi_malloc` guarantees for a block at least this large.
    const PLAIN_ALIGN: usize = if cfg!(target_pointer_width = "64") {
        16
    } else {
        8
    };

    /// mimalloc's `*_aligned` calls take a slow over-allocating path for every block above its
    /// small size (1 KiB) that is not a power of two, whatever the alignment asked for: 12 a
    /// proxied request, about 3% of its instructions (callgrind, BENCHMARKS.md).
    pub struct Mimalloc;

    /// Whether the plain calls already give `layout`'s alignment.
    fn plain(align: usize, size: usize) -> bool {
        align <= PLAIN_ALIGN && align <= size
    }

    // SAFETY: every block comes from mimalloc and goes back to it (`mi_free` takes blocks of
    // either kind of call); the plain calls are used only where their alignment suffices.
    unsafe impl GlobalAlloc for Mimalloc {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: mimalloc's allocation calls accept any size; alignment is a power of two.
            unsafe {
                if plain(layout.align(), layout.size()) {
                    mi_malloc(layout.size()).cast()
                } else {
                    mi_malloc_aligned(layout.size(), layout.align()).cast()
                }
            }
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: as in `alloc`.
            unsafe {
                if plain(layout.align(), layout.size()) {
                    mi_zalloc(layout.size()).cast()
                } else {
                    mi_zalloc_aligned(layout.size(), layout.align()).cast()
                }
            }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
            // SAFETY: `ptr` came from this allocator, so from mimalloc.
            unsafe { mi_free(ptr.cast::<c_void>()) }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: `ptr` came from this allocator with `layout`'s alignment.
            unsafe {
                if plain(layout.align(), new_size) {
                    mi_realloc(ptr.cast::<c_void>(), new_size).cast()
                } else {
                    mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
                }
            }
        }
    }

    unsafe extern "C" {
        /// mimalloc's collection (in the library `libmimalloc-sys` builds; declared there only
        /// with its `extended` feature, which would add a crate): with `force` false, frees
        /// what this thread holds for nothing and purges every freed range whose purge delay
        /// has passed.
        fn mi_collect(force: bool);
    }

    /// How often the reclaimer asks mimalloc to purge.
    const RECLAIM_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

    /// Starts a thread that gives freed memory back to the OS. mimalloc purges a freed range
    /// (`MADV_DONTNEED`) only once its delay (1 s) has passed and only when some thread calls
    /// into it afterwards: a gateway that fell quiet after a burst kept it all resident (50
    /// unfinished 6.25 MiB uploads: RSS still 83 MiB over its baseline 10 s after they closed;
    /// with this thread, within 16 MiB of it after about 2 s). One `mi_collect(false)` a second
    /// costs next to nothing: this thread's heap is empty, and the arenas are purged only where
    /// a delay has run out.
    pub fn spawn_reclaimer() {
        let started = std::thread::Builder::new()
            .name("infergate-reclaim".into())
            .spawn(|| {
                loop {
                    std::thread::sleep(RECLAIM_EVERY);
                    // SAFETY: `mi_collect` takes no pointers and may be called from any thread.
                    unsafe { mi_collect(false) };
                }
            });
        if let Err(e) = started {
            tracing::warn!(
                error = %e,
                "cannot start the memory reclaimer; freed memory goes back to the OS later"
            );
        }
    }
}

/// Inference gateway and smart load balancer for LLM serving.
#[derive(Parser)]
#[command(name = "infergate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Gateway plus locally spawned sim workers from the embedded default config: one command, no GPU.
    Up(RunArgs),
    /// The gateway alone, in front of the workers its config names (ours, vLLM, SGLang, TGI).
    Gateway(RunArgs),
    /// Run one engine worker (OpenAI-compatible API, vLLM metrics).
    Engine(EngineArgs),
    /// Replay a workload against a gateway or engine; `bench diff A.json B.json` compares two reports.
    Bench(infergate_cli::bench::BenchCli),
    /// Offline what-if: the real engine schedulers and routing policy on a virtual clock.
    Sim(Box<infergate_cli::sim::SimArgs>),
    /// Calculators: KV-cache budget (`plan kv`), speculative-decoding payoff (`plan spec`) and
    /// replicas for an SLO (`plan capacity`).
    Plan {
        #[command(subcommand)]
        command: PlanCommand,
    },
    /// API keys: `infergate keys create` makes a key and prints the hash line for the config.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// On-call triage: names the symptom (3.1–3.5) the gateway's live metrics show, with its
    /// mechanism, lever, confirming measurement and falsifier.
    Doctor(infergate_cli::doctor::DoctorArgs),
    /// A trace file's shapes (steps by batch size and path, lengths, features, cache); with
    /// `--propose`, capture sizes chosen on one window and checked on a later one.
    Shapes(infergate_cli::shapes::ShapesArgs),
    /// The usage ledger as a table: spend and tokens per day, tenant, model, key, version.
    Usage(infergate_cli::usage_cli::UsageArgs),
    /// Configuration tools.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Subcommand)]
enum PlanCommand {
    /// KV bytes per token, blocks, concurrent sequences, and what full-context requests displace.
    Kv(infergate_cli::plan::KvArgs),
    /// Expected tokens per target step, speedup bound and where speculation stops paying.
    Spec(infergate_cli::plan::SpecArgs),
    /// Replicas needed for a workload's SLOs (found by simulation), with one replica of headroom.
    Capacity(infergate_cli::plan::CapacityArgs),
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Generate a new random key; print it once and the config entry holding only its hash.
    Create {
        /// Tenant name for the printed config entry.
        #[arg(long, default_value = "my-team")]
        tenant: String,
        /// Tier for the printed config entry.
        #[arg(long, default_value = "free")]
        tier: String,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate a config and its policies; print every error with file and line (exit 1 on error).
    Check {
        /// Config file (default: config/infergate.yaml).
        #[arg(long, default_value = "config/infergate.yaml")]
        config: PathBuf,
    },
}

fn init_logs(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    // Colour only on a terminal, and never with NO_COLOR set (https://no-color.org).
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// Runs `f` on a fresh multi-threaded runtime; `None` (said on stderr) when none could start.
fn run_async<T>(f: impl std::future::Future<Output = T>) -> Option<T> {
    match tokio::runtime::Runtime::new() {
        Ok(runtime) => Some(runtime.block_on(f)),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            None
        }
    }
}

fn block_on(f: impl std::future::Future<Output = Result<(), String>>) -> ExitCode {
    match run_async(f) {
        Some(Ok(())) => ExitCode::SUCCESS,
        Some(Err(e)) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
        None => ExitCode::FAILURE,
    }
}

/// A tool's report printed, or its error.
fn printed(result: Result<String, String>) -> ExitCode {
    match result {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `up` (with a demo key when no tenants are declared) and `gateway`.
fn run_gateway(args: RunArgs, demo_key: bool) -> ExitCode {
    let loaded = match load_snapshot(args.config.as_deref()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    init_logs(loaded.0.log.format, &loaded.0.log.level);
    allocator::spawn_reclaimer();
    block_on(infergate::up::run(args, loaded, demo_key))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Engine(args) => {
            init_logs(LogFormat::Text, "info");
            block_on(infergate_engine::server::serve(args))
        }
        Command::Up(args) => run_gateway(args, true),
        Command::Gateway(args) => run_gateway(args, false),
        Command::Bench(cli) => {
            init_logs(LogFormat::Text, "warn");
            run_async(infergate_cli::bench::main(cli)).map_or(ExitCode::FAILURE, printed)
        }
        Command::Sim(args) => printed(infergate_cli::sim::run(&args)),
        Command::Plan { command } => {
            let out = match command {
                PlanCommand::Kv(a) => infergate_cli::plan::run_kv(&a),
                PlanCommand::Spec(a) => infergate_cli::plan::run_spec(&a),
                PlanCommand::Capacity(a) => infergate_cli::plan::run_capacity(&a),
            };
            printed(out)
        }
        Command::Keys {
            command: KeysCommand::Create { tenant, tier },
        } => match infergate::tenants::generate_key() {
            Ok(key) => {
                let hash = infergate::tenants::format_hash(&infergate::tenants::hash_key(&key));
                println!("key:  {key}");
                println!(
                    "      (shown once: give it to the tenant; the gateway stores only its hash)"
                );
                println!("config/infergate.yaml:");
                println!("tenants:");
                println!("  - name: {tenant}");
                println!("    tier: {tier}");
                println!("    keys: [\"{hash}\"]");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: cannot read randomness: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Doctor(args) => {
            init_logs(LogFormat::Text, "warn");
            run_async(infergate_cli::doctor::run(&args)).map_or(ExitCode::FAILURE, printed)
        }
        Command::Usage(args) => printed(infergate_cli::usage_cli::run(&args)),
        Command::Shapes(args) => printed(infergate_cli::shapes::run(&args)),
        Command::Config {
            command: ConfigCommand::Check { config },
        } => match infergate::config::load(&config) {
            Ok(s) => {
                println!(
                    "{}: OK ({} models, {} pools)",
                    config.display(),
                    s.models.len(),
                    s.pools.len()
                );
                ExitCode::SUCCESS
            }
            Err(errors) => {
                for e in &errors.0 {
                    eprintln!("{e}");
                }
                eprintln!("{}: {} error(s)", config.display(), errors.0.len());
                ExitCode::FAILURE
            }
        },
    }
}
