//! A private certificate authority for TLS tests: a CA and the certificates it signs, written as
//! PEM files into a directory of their own (removed on drop). Servers get `localhost` and
//! `127.0.0.1` as names; a client certificate's common name is its user (PostgreSQL maps it).

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A certificate and its key, as files.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CertFiles {
    pub fn cert_path(&self) -> String {
        self.cert.display().to_string()
    }

    pub fn key_path(&self) -> String {
        self.key.display().to_string()
    }
}

/// A CA whose files live in `dir`.
pub struct Pki {
    dir: PathBuf,
    ca: CertifiedIssuer<'static, KeyPair>,
    /// The CA certificate (PEM file).
    pub ca_file: PathBuf,
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Pki {
    /// A new CA named `name` in a fresh temporary directory.
    pub fn new(name: &str) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(crate::unique_name("fs_pki"));
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        let ca_file = dir.join("ca.pem");
        write(&ca_file, ca.pem().as_bytes())?;
        Ok(Self { dir, ca, ca_file })
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn ca_path(&self) -> String {
        self.ca_file.display().to_string()
    }

    /// A server certificate for `localhost` and `127.0.0.1`, named `name` in the directory.
    pub fn server(&self, name: &str) -> anyhow::Result<CertFiles> {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(name, params)
    }

    /// A client certificate whose common name is `user`.
    pub fn client(&self, user: &str) -> anyhow::Result<CertFiles> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(&format!("client-{user}"), params)
    }

    /// A certificate that serves both ends (a service is a server and a client of others).
    pub fn service(&self, name: &str) -> anyhow::Result<CertFiles> {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        self.issue(name, params)
    }

    fn issue(&self, name: &str, params: CertificateParams) -> anyhow::Result<CertFiles> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.ca)?;
        let files = CertFiles {
            cert: self.dir.join(format!("{name}.pem")),
            key: self.dir.join(format!("{name}.key")),
        };
        write(&files.cert, cert.pem().as_bytes())?;
        write(&files.key, key.serialize_pem().as_bytes())?;
        Ok(files)
    }
}

fn write(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("write {}", path.display()))
}
