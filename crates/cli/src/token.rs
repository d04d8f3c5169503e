//! `flashsale token`: mint a bearer token for a user, an admin or a service.

use std::{process::ExitCode, time::Duration};

use flashsale_bench::client::Secret;
use flashsale_platform::auth::Role;

#[derive(clap::Args)]
pub struct Args {
    /// The subject (user id, admin name or service name).
    #[arg(long)]
    sub: String,
    /// user, admin or service.
    #[arg(long, default_value = "user")]
    role: Role,
    /// Lifetime in seconds.
    #[arg(long, default_value_t = 3600)]
    ttl_secs: u64,
    #[command(flatten)]
    secret: Secret,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        (1..=31_536_000).contains(&args.ttl_secs),
        "--ttl-secs must be 1..=31536000"
    );
    println!(
        "{}",
        args.secret
            .mint(&args.sub, args.role, Duration::from_secs(args.ttl_secs))?
    );
    Ok(ExitCode::SUCCESS)
}
