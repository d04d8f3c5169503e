//! `flashsale-outbound`: `serve` (the default) until SIGTERM/SIGINT, or `migrate` and exit.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    flashsale_platform::app::main::<flashsale_outbound::startup::Outbound>(
        env!("CARGO_BIN_NAME"),
        env!("CARGO_PKG_DESCRIPTION"),
        env!("CARGO_PKG_VERSION"),
    )
    .await
}
