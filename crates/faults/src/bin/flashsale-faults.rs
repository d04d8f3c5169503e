//! `flashsale-faults --scenario NAME|all [--seed N]`: runs fault scenarios and prints one line of
//! figures each; `flashsale-faults soak --seed N --seconds S`: one S-second sale through a
//! seeded mix of faults, one line of figures (`--clusters`: on a Redis Cluster and a RabbitMQ
//! cluster, with master failovers and node kills in the mix). The exit code is non-zero when anything fails or
//! cannot run.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use flashsale_faults::scenario::{self, ALL, SharedBroker};

#[derive(Parser)]
#[command(
    about = "Fault-injection scenarios for flashsale, on private servers",
    args_conflicts_with_subcommands = true
)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// A scenario's name, or `all`; repeat it to run several.
    #[arg(long, default_value = "all")]
    scenario: Vec<String>,
    /// Seeds the buyers' choices (pay, never pay, pay late, cancel).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Subcommand)]
enum Command {
    /// One sale lasting `--seconds`, restocked every 10 s, through faults injected one at a
    /// time at moments chosen from `--seed` (the same seed replays the same schedule).
    Soak {
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Run on a Redis Cluster (three masters, three replicas) and a three-node RabbitMQ
        /// cluster; master failovers and node kills replace the single servers' restarts.
        #[arg(long)]
        clusters: bool,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(Command::Soak {
        seed,
        seconds,
        clusters,
    }) = args.command
    {
        return soak(seed, seconds, clusters).await;
    }
    let names: Vec<&str> = if args.scenario.iter().any(|s| s == "all") {
        ALL.to_vec()
    } else {
        args.scenario.iter().map(String::as_str).collect()
    };
    if let Some(bad) = names.iter().find(|n| !ALL.contains(n)) {
        eprintln!("no scenario `{bad}`; the scenarios: {}", ALL.join(", "));
        return ExitCode::from(2);
    }
    let broker = match SharedBroker::start().await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("cannot start the suite's RabbitMQ node: {e:#}");
            return ExitCode::from(2);
        }
    };
    let mut failed = Vec::new();
    let all = async {
        for name in names {
            eprintln!("== {name}");
            match scenario::run(name, args.seed, Some(&broker)).await {
                Ok(f) if f.pass() => {}
                Ok(_) => failed.push(name.to_owned()),
                Err(e) => {
                    println!("scenario={name} result=ERROR error={e:#}");
                    failed.push(name.to_owned());
                }
            }
        }
    };
    // On Ctrl-C or SIGTERM the running scenario is dropped, and with it every server and
    // service it started (they run in process groups of their own and would outlive us).
    tokio::select! {
        () = all => {}
        () = interrupted() => {
            eprintln!("interrupted: servers and services stopped");
            return ExitCode::from(130);
        }
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("failed: {}", failed.join(", "));
        ExitCode::FAILURE
    }
}

async fn soak(seed: u64, seconds: u64, clusters: bool) -> ExitCode {
    // Dropping the soak's future (Ctrl-C, SIGTERM) stops every server and service it started.
    tokio::select! {
        r = flashsale_faults::soak::run(seed, seconds, clusters) => match r {
            Ok(f) if f.pass() => ExitCode::SUCCESS,
            Ok(_) => ExitCode::FAILURE,
            Err(e) => {
                println!("scenario=soak seed={seed} seconds={seconds} result=ERROR error={e:#}");
                ExitCode::FAILURE
            }
        },
        () = interrupted() => {
            eprintln!("interrupted: servers and services stopped");
            ExitCode::from(130)
        }
    }
}

async fn interrupted() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}
