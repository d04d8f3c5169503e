//! `flashsale token`, and the token every other command sends.

use std::{process::ExitCode, time::Duration};

use flashsale_platform::auth::{DEV_SECRET, JwtKeys, MAX_SUBJECT_LEN, Role};

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

/// Where tokens come from: the HS256 secret shared with the services.
#[derive(clap::Args, Clone)]
pub struct Secret {
    /// HS256 secret; the services' development secret when unset.
    #[arg(
        long = "secret",
        env = "FLASHSALE_JWT_SECRET",
        hide_env_values = true,
        global = true
    )]
    value: Option<String>,
}

impl Secret {
    /// A token for `sub` with `role`, valid for `ttl`.
    pub fn mint(&self, sub: &str, role: Role, ttl: Duration) -> anyhow::Result<String> {
        anyhow::ensure!(
            !sub.is_empty() && sub.len() <= MAX_SUBJECT_LEN,
            "--sub must be 1..={MAX_SUBJECT_LEN} bytes"
        );
        let secret = self
            .value
            .clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| DEV_SECRET.to_owned());
        JwtKeys::new(secret.as_bytes())?
            .mint(sub, role, ttl)
            .map_err(|e| anyhow::anyhow!("{e}"))
    }
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
