//! `flashsale-product-stock`: load settings, start telemetry, serve until SIGTERM/SIGINT.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = flashsale_product_stock::config::load()?;
    let _telemetry = flashsale_platform::telemetry::init(&settings.telemetry, "product-stock")?;
    flashsale_product_stock::startup::build(settings)
        .await?
        .run_until_signalled()
        .await
}
