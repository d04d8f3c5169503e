//! `flashsale`: the command-line face of the platform — mint tokens, check health, administer
//! products, place and follow orders (and, in later issues, run load).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod health;
mod order;
mod output;
mod product;
mod token;

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
}

#[tokio::main]
async fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Token(args) => token::run(args),
        Command::Health(args) => health::run(args).await,
        Command::Product(args) => product::run(args).await,
        Command::Order(args) => order::run(args).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
