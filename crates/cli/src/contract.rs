//! `flashsale contract`: the gRPC contract as a file other tools load (API gateways,
//! `grpcurl -protoset`, `buf`), the same descriptors the services' reflection serves.

use std::{io::Write as _, path::PathBuf, process::ExitCode};

use anyhow::Context as _;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Write the encoded google.protobuf.FileDescriptorSet of the whole contract: every
    /// flashsale package, the google.rpc error details refusals carry, and the
    /// google.protobuf types they use.
    DescriptorSet {
        /// File to write ("-" for standard output); missing directories are created.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.command {
        Command::DescriptorSet { out } => {
            let bytes = flashsale_proto::FILE_DESCRIPTOR_SET;
            if out.as_os_str() == "-" {
                let mut stdout = std::io::stdout().lock();
                stdout
                    .write_all(bytes)
                    .context("write to standard output")?;
                stdout.flush().context("write to standard output")?;
            } else {
                if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("create {}", dir.display()))?;
                }
                std::fs::write(&out, bytes).with_context(|| format!("write {}", out.display()))?;
                eprintln!(
                    "flashsale: wrote the contract's descriptor set ({} bytes) to {}",
                    bytes.len(),
                    out.display()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use prost_reflect::DescriptorPool;

    use super::*;

    #[test]
    fn descriptor_set_file_holds_the_services_and_the_error_details() {
        let dir = std::env::temp_dir().join(format!("flashsale-contract-{}", uuid::Uuid::new_v4()));
        let out = dir.join("nested").join("flashsale.binpb");
        let code = run(Args {
            command: Command::DescriptorSet { out: out.clone() },
        })
        .unwrap();
        assert_eq!(code, ExitCode::SUCCESS);

        let bytes = std::fs::read(&out).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        // Decoding into a pool also checks that every import is in the file.
        let pool = DescriptorPool::decode(bytes.as_slice()).unwrap();
        for service in flashsale_proto::SERVICE_NAMES {
            assert!(pool.get_service_by_name(service).is_some(), "{service}");
        }
        assert!(
            pool.get_service_by_name("flashsale.order.v1.OrderService")
                .is_some()
        );
        for message in [
            "google.rpc.Status",
            "google.rpc.ErrorInfo",
            "google.rpc.BadRequest",
        ] {
            assert!(pool.get_message_by_name(message).is_some(), "{message}");
        }
    }
}
