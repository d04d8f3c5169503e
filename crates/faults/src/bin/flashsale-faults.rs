//! `flashsale-faults --scenario NAME|all [--seed N]`: runs fault scenarios and prints one line of
//! figures each; the exit code is non-zero when any scenario fails or cannot run.

use std::process::ExitCode;

use clap::Parser;
use flashsale_faults::scenario::{self, ALL, SharedBroker};

#[derive(Parser)]
#[command(about = "Fault-injection scenarios for flashsale, on private servers")]
struct Args {
    /// A scenario's name, or `all`; repeat it to run several.
    #[arg(long, default_value = "all")]
    scenario: Vec<String>,
    /// Seeds the buyers' choices (pay, never pay, pay late, cancel).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
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
