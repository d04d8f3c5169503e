//! `flashsale-order`: `serve` (the default) until SIGTERM/SIGINT, or `migrate` and exit.

use flashsale_order::{config, migration::Migrator, startup};
use flashsale_platform::cli::{ServiceArgs, ServiceCommand, migrate};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = ServiceArgs::parse_for(
        env!("CARGO_BIN_NAME"),
        env!("CARGO_PKG_DESCRIPTION"),
        env!("CARGO_PKG_VERSION"),
    );
    let settings = config::load()?;
    let _telemetry = flashsale_platform::telemetry::init(&settings.telemetry, "order")?;
    match args.command() {
        ServiceCommand::Serve => startup::build(settings).await?.run_until_signalled().await,
        ServiceCommand::Migrate => migrate::<Migrator>("order", &settings.database).await,
    }
}
