//! `flashsale`: the command-line face of the platform — mint tokens, check health, administer
//! products, place and follow orders, find stuck orders, look up shipments, replay or discard
//! parked messages, check a running service against its contract; and, from
//! `flashsale-bench`, run a flash sale end to end and benchmark the platform.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use flashsale_bench::{bench, sale};

mod contract;
mod dlq;
mod health;
mod order;
mod output;
mod product;
mod shipment;
mod stuck;
mod timeline;
mod token;
mod verify;

#[derive(Parser)]
#[command(
    name = "flashsale",
    version,
    about = "Flash-sale platform command line"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mint a JWT bearer token for a user, an admin or a service.
    Token(token::Args),
    /// Check grpc.health.v1 of the three services; exit 0 only if all are SERVING.
    Health(health::Args),
    /// Products and their stock (product-stock service).
    Product(product::Args),
    /// Buyers' orders: place, follow, pay, cancel (order service).
    Order(order::Args),
    /// Shipments of paid orders (outbound service).
    Shipment(shipment::Args),
    /// Run a flash sale end to end: create a product, flood it with buyers, pay, cancel and pay
    /// late, wait for quiescence, then report and check the invariants.
    Sale(Box<sale::Args>),
    /// Benchmark the platform against the naive design and the raw ceilings, back to back.
    Bench(Box<bench::Args>),
    /// Regenerate docs/benchmarks.md's tables and charts from the kept benchmark results.
    BenchReport(flashsale_bench::kept::Args),
    /// Receive the services' OTLP trace exports until stopped, then print how many spans and
    /// traces arrived (a collector stand-in for benchmarks and trials).
    TraceSink(flashsale_bench::sink::Args),
    /// Parked messages of a service: list, replay, discard (admin).
    Dlq(dlq::Args),
    /// The gRPC contract as files for other tools (API gateways, grpcurl -protoset).
    Contract(contract::Args),
    /// Check a running service against its contract: health, reflection, every rpc's happy
    /// path and documented errors, on products and buyers of its own.
    Verify(verify::Args),
}

#[tokio::main]
async fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Token(args) => token::run(args),
        Command::Health(args) => health::run(args).await,
        Command::Product(args) => product::run(args).await,
        Command::Order(args) => order::run(args).await,
        Command::Shipment(args) => shipment::run(args).await,
        Command::Sale(args) => sale::run(*args).await,
        Command::Bench(args) => bench::run(*args).await,
        Command::BenchReport(args) => flashsale_bench::kept::run(args),
        Command::TraceSink(args) => flashsale_bench::sink::run(args).await,
        Command::Dlq(args) => dlq::run(args).await,
        Command::Contract(args) => contract::run(args),
        Command::Verify(args) => verify::run(args).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
