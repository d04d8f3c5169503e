//! The command line every service binary shares: `serve` (what runs when no subcommand is given)
//! and `migrate`, plus `--help` and `--version`.

use clap::{CommandFactory, FromArgMatches as _, Parser, Subcommand};
use sea_orm_migration::MigratorTrait;

use crate::settings::DatabaseSettings;

/// A service binary's arguments.
#[derive(Debug, Parser)]
pub struct ServiceArgs {
    #[command(subcommand)]
    command: Option<ServiceCommand>,
}

/// What a service binary does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Subcommand)]
pub enum ServiceCommand {
    /// Migrate the database, then serve gRPC and /metrics until SIGTERM or SIGINT (the default).
    Serve,
    /// Create the database if it is missing, apply the pending migrations, and exit.
    Migrate,
}

impl ServiceArgs {
    /// Parses the process's arguments for the binary `name`; on `--help`, `--version` or bad
    /// input prints what clap prints and exits (0 for help and version, 2 for bad input).
    pub fn parse_for(name: &'static str, about: &'static str, version: &'static str) -> Self {
        Self::try_parse_for(name, about, version, std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// [`ServiceArgs::parse_for`] over explicit arguments (the first is the program name).
    pub fn try_parse_for<I, T>(
        name: &'static str,
        about: &'static str,
        version: &'static str,
        args: I,
    ) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let matches = <Self as CommandFactory>::command()
            .name(name)
            .bin_name(name)
            .about(about)
            .version(version)
            .try_get_matches_from(args)?;
        Self::from_arg_matches(&matches)
    }

    /// The subcommand given, `serve` when none was.
    pub fn command(&self) -> ServiceCommand {
        self.command.unwrap_or(ServiceCommand::Serve)
    }
}

/// `migrate`: connects to the service's database (creating it when missing), applies the
/// migrations `M` has not applied yet, and reports how many it applied.
pub async fn migrate<M: MigratorTrait>(
    service: &str,
    database: &DatabaseSettings,
) -> anyhow::Result<()> {
    let db = crate::db::connect(database).await?;
    let result = crate::db::migrate::<M>(&db, service).await;
    db.close().await.ok();
    let applied = result?;
    println!("{service}: database migrated ({applied} migrations applied)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<ServiceArgs, clap::Error> {
        ServiceArgs::try_parse_for("flashsale-demo", "A demo service", "1.2.3", args)
    }

    #[test]
    fn serve_is_the_default_and_migrate_is_a_subcommand() {
        let none = parse(&["flashsale-demo"]).map(|a| a.command());
        assert_eq!(none.ok(), Some(ServiceCommand::Serve));
        let serve = parse(&["flashsale-demo", "serve"]).map(|a| a.command());
        assert_eq!(serve.ok(), Some(ServiceCommand::Serve));
        let migrate = parse(&["flashsale-demo", "migrate"]).map(|a| a.command());
        assert_eq!(migrate.ok(), Some(ServiceCommand::Migrate));
    }

    #[test]
    fn bad_input_is_an_error_and_help_and_version_name_the_binary() {
        use clap::error::ErrorKind;
        let kind = |args: &[&str]| parse(args).err().map(|e| e.kind());
        assert_eq!(
            kind(&["flashsale-demo", "launch"]),
            Some(ErrorKind::InvalidSubcommand)
        );
        assert_eq!(
            kind(&["flashsale-demo", "--frobnicate"]),
            Some(ErrorKind::UnknownArgument)
        );
        assert_eq!(
            kind(&["flashsale-demo", "migrate", "extra"]),
            Some(ErrorKind::UnknownArgument)
        );
        let version = parse(&["flashsale-demo", "--version"])
            .err()
            .map(|e| e.to_string());
        assert_eq!(version.as_deref(), Some("flashsale-demo 1.2.3\n"));
        let help = parse(&["flashsale-demo", "--help"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(help.contains("A demo service"), "{help}");
        assert!(help.contains("serve") && help.contains("migrate"), "{help}");
    }
}
