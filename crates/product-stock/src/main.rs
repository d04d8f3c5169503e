//! `flashsale-product-stock`: `serve` (the default) until SIGTERM/SIGINT, or `migrate` and exit.

use flashsale_platform::cli::{ServiceArgs, ServiceCommand, migrate};
use flashsale_product_stock::{config, migration::Migrator, startup};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = ServiceArgs::parse_for(
        env!("CARGO_BIN_NAME"),
        env!("CARGO_PKG_DESCRIPTION"),
        env!("CARGO_PKG_VERSION"),
    );
    let settings = config::load()?;
    let _telemetry = flashsale_platform::telemetry::init(&settings.telemetry, "product-stock")?;
    match args.command() {
        ServiceCommand::Serve => startup::build(settings).await?.run_until_signalled().await,
        ServiceCommand::Migrate => migrate::<Migrator>("product-stock", &settings.database).await,
    }
}
