//! TLS settings: the gRPC server's certificate and the CA its clients' certificates must chain to
//! (mutual TLS), the certificate this service presents when it calls another over `https://`,
//! and the CA and client certificate for Redis (`rediss://`) and RabbitMQ (`amqps://`).
//! PostgreSQL takes its TLS settings in the URL (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`).
//!
//! Everything is PEM files named in configuration; a file that cannot be read stops the service
//! at start-up with the key named. A URL that asks for TLS never falls back to plain text: the
//! connection fails instead (docs/security.md#tls).

use serde::{Deserialize, Serialize};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

use crate::config::ConfigError;

/// `grpc.tls.*`: TLS of the gRPC server and of this service's calls to other services.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GrpcTlsSettings {
    /// The server's certificate chain (PEM). Set with `key_file`, the server speaks only TLS.
    pub cert_file: String,
    /// The server's private key (PEM).
    pub key_file: String,
    /// CA certificates (PEM) client certificates must chain to. Set: mutual TLS, a client
    /// without such a certificate is refused during the handshake.
    pub client_ca_file: String,
    /// CA certificates (PEM) the servers this service calls over `https://` must chain to;
    /// empty: the system's roots.
    pub ca_file: String,
    /// The certificate (PEM) this service presents to the servers it calls (mutual TLS).
    pub client_cert_file: String,
    /// Its private key (PEM).
    pub client_key_file: String,
}

/// The CA and client certificate of a store reached over TLS (`redis.tls.*`, `amqp.tls.*`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StoreTlsSettings {
    /// CA certificates (PEM) the server's certificate must chain to; empty: the system's roots.
    pub ca_file: String,
    /// The client certificate (PEM), for a server that asks for one.
    pub cert_file: String,
    /// Its private key (PEM).
    pub key_file: String,
}

/// Reads a PEM file named by `key`.
pub fn read_pem(key: &str, path: &str) -> Result<Vec<u8>, ConfigError> {
    let bytes = std::fs::read(path)
        .map_err(|e| ConfigError::invalid(key, format!("cannot read `{path}`: {e}")))?;
    if !bytes
        .windows(b"-----BEGIN ".len())
        .any(|w| w == b"-----BEGIN ")
    {
        return Err(ConfigError::invalid(key, format!("`{path}` is not PEM")));
    }
    Ok(bytes)
}

/// A certificate chain and its private key, PEM.
pub type PemPair = (Vec<u8>, Vec<u8>);

/// A certificate and key named together: both or neither.
fn pair<'a>(
    p: &str,
    (cert_key, cert): (&str, &'a str),
    (key_key, key): (&str, &'a str),
) -> Result<Option<PemPair>, ConfigError> {
    match (cert.is_empty(), key.is_empty()) {
        (true, true) => Ok(None),
        (false, true) => Err(ConfigError::invalid(
            format!("{p}.{key_key}"),
            format!("must be set with {cert_key}"),
        )),
        (true, false) => Err(ConfigError::invalid(
            format!("{p}.{cert_key}"),
            format!("must be set with {key_key}"),
        )),
        (false, false) => Ok(Some((
            read_pem(&format!("{p}.{cert_key}"), cert)?,
            read_pem(&format!("{p}.{key_key}"), key)?,
        ))),
    }
}

fn optional_pem(p: &str, key: &str, path: &str) -> Result<Option<Vec<u8>>, ConfigError> {
    if path.is_empty() {
        Ok(None)
    } else {
        read_pem(&format!("{p}.{key}"), path).map(Some)
    }
}

// === impl GrpcTlsSettings ===

impl GrpcTlsSettings {
    /// Checks every file named can be read as PEM and pairs are complete; `p` is the section
    /// (`order.grpc.tls`).
    pub fn validate(&self, p: &str) -> Result<(), ConfigError> {
        self.server(p)?;
        self.client(p)?;
        Ok(())
    }

    /// Whether the server speaks TLS.
    pub fn serves_tls(&self) -> bool {
        !self.cert_file.is_empty()
    }

    /// The server's TLS configuration, `None` for plain text.
    pub fn server(&self, p: &str) -> Result<Option<ServerTlsConfig>, ConfigError> {
        let identity = pair(
            p,
            ("cert_file", &self.cert_file),
            ("key_file", &self.key_file),
        )?;
        let client_ca = optional_pem(p, "client_ca_file", &self.client_ca_file)?;
        match (identity, client_ca) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err(ConfigError::invalid(
                format!("{p}.client_ca_file"),
                "mutual TLS needs the server's own certificate: set cert_file and key_file",
            )),
            (Some((cert, key)), ca) => {
                let mut config = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
                if let Some(ca) = ca {
                    config = config
                        .client_ca_root(Certificate::from_pem(ca))
                        .client_auth_optional(false);
                }
                Ok(Some(config))
            }
        }
    }

    /// The TLS configuration of calls to `https://` servers (trust and client certificate).
    pub fn client(&self, p: &str) -> Result<ClientTlsConfig, ConfigError> {
        let mut config = ClientTlsConfig::new();
        config = match optional_pem(p, "ca_file", &self.ca_file)? {
            Some(ca) => config.ca_certificate(Certificate::from_pem(ca)),
            None => config.with_native_roots(),
        };
        if let Some((cert, key)) = pair(
            p,
            ("client_cert_file", &self.client_cert_file),
            ("client_key_file", &self.client_key_file),
        )? {
            config = config.identity(Identity::from_pem(cert, key));
        }
        Ok(config)
    }
}

// === impl StoreTlsSettings ===

impl StoreTlsSettings {
    /// Checks every file named can be read as PEM and the pair is complete.
    pub fn validate(&self, p: &str) -> Result<(), ConfigError> {
        optional_pem(p, "ca_file", &self.ca_file)?;
        pair(
            p,
            ("cert_file", &self.cert_file),
            ("key_file", &self.key_file),
        )?;
        Ok(())
    }

    /// Whether anything is set.
    pub fn is_set(&self) -> bool {
        !(self.ca_file.is_empty() && self.cert_file.is_empty() && self.key_file.is_empty())
    }

    /// The CA (PEM), if one is named.
    pub fn ca(&self, p: &str) -> Result<Option<Vec<u8>>, ConfigError> {
        optional_pem(p, "ca_file", &self.ca_file)
    }

    /// The client certificate and key (PEM), if named.
    pub fn identity(&self, p: &str) -> Result<Option<PemPair>, ConfigError> {
        pair(
            p,
            ("cert_file", &self.cert_file),
            ("key_file", &self.key_file),
        )
    }
}
