//! The identity provider's public keys: a JWKS file (`{"keys": [...]}`, RFC 7517) of RS256 and
//! ES256 keys, each with its `kid`. A token names the key that signed it in its header's `kid`;
//! publishing a new key beside the old one is how the provider rotates (docs/security.md).

use std::collections::HashMap;

use jsonwebtoken::{
    Algorithm, DecodingKey,
    jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse},
};

/// One verification key of a JWKS.
#[derive(Clone)]
pub struct PublicKey {
    pub algorithm: Algorithm,
    pub key: DecodingKey,
}

/// The keys of a JWKS file by `kid`.
pub type Keys = HashMap<String, PublicKey>;

/// Reads and checks the JWKS at `path`. Encryption keys (`"use": "enc"`) are skipped; any other
/// key must be RS256 or ES256 (P-256) with a unique `kid`, and the file must hold at least one.
pub fn load(path: &str) -> Result<Keys, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read `{path}`: {e}"))?;
    parse(&text).map_err(|e| format!("`{path}`: {e}"))
}

/// [`load`] on the file's text.
pub fn parse(text: &str) -> Result<Keys, String> {
    let doc: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let entries = doc
        .get("keys")
        .and_then(serde_json::Value::as_array)
        .ok_or("not a JWKS: no `keys` array")?;
    let mut keys = Keys::new();
    for (i, entry) in entries.iter().enumerate() {
        let members: &[&str] = match entry.get("kty").and_then(serde_json::Value::as_str) {
            Some("RSA") => &["n", "e"],
            Some("EC") => &["crv", "x", "y"],
            _ => &[],
        };
        if let Some(missing) = members.iter().find(|m| entry.get(**m).is_none()) {
            return Err(format!("key {i} is not a valid JWK: no `{missing}`"));
        }
        let jwk: Jwk = serde_json::from_value(entry.clone())
            .map_err(|e| format!("key {i} is not a valid JWK: {e}"))?;
        if jwk.common.public_key_use == Some(PublicKeyUse::Encryption) {
            continue;
        }
        let kid = jwk
            .common
            .key_id
            .clone()
            .filter(|k| !k.is_empty())
            .ok_or_else(|| format!("key {i} has no `kid`"))?;
        let algorithm = algorithm_of(&jwk).map_err(|e| format!("key `{kid}`: {e}"))?;
        let key = DecodingKey::from_jwk(&jwk).map_err(|e| format!("key `{kid}`: {e}"))?;
        if keys
            .insert(kid.clone(), PublicKey { algorithm, key })
            .is_some()
        {
            return Err(format!("two keys have the kid `{kid}`"));
        }
    }
    if keys.is_empty() {
        return Err("holds no signing key".to_owned());
    }
    Ok(keys)
}

/// The key's algorithm: its `alg`, or what its type implies when it has none.
fn algorithm_of(jwk: &Jwk) -> Result<Algorithm, String> {
    let implied = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
        AlgorithmParameters::EllipticCurve(p) => {
            return Err(format!("curve {:?} is not supported (P-256 only)", p.curve));
        }
        _ => return Err("only RSA and EC (P-256) keys are accepted".to_owned()),
    };
    match jwk.common.key_algorithm {
        None => Ok(implied),
        Some(KeyAlgorithm::RS256) if implied == Algorithm::RS256 => Ok(Algorithm::RS256),
        Some(KeyAlgorithm::ES256) if implied == Algorithm::ES256 => Ok(Algorithm::ES256),
        Some(other) => Err(format!(
            "algorithm {other:?} is not accepted for this key (RS256 for RSA, ES256 for P-256)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broken_files_are_refused_with_a_reason() {
        let cases = [
            ("{", "not JSON"),
            ("{\"nokeys\": []}", "no `keys` array"),
            ("{\"keys\": []}", "no signing key"),
            ("{\"keys\": [{\"kty\": \"RSA\"}]}", "not a valid JWK"),
            (
                "{\"keys\": [{\"kty\": \"oct\", \"k\": \"c2VjcmV0\", \"kid\": \"h\"}]}",
                "only RSA and EC",
            ),
            (
                "{\"keys\": [{\"kty\": \"EC\", \"crv\": \"P-256\", \"x\": \"AA\", \"y\": \"AA\"}]}",
                "has no `kid`",
            ),
        ];
        for (text, reason) in cases {
            let err = parse(text).err().unwrap_or_default();
            assert!(err.contains(reason), "{text}: `{err}` lacks `{reason}`");
        }
        let err = load("/nonexistent/jwks.json").err().unwrap_or_default();
        assert!(
            err.contains("cannot read `/nonexistent/jwks.json`"),
            "{err}"
        );
    }
}
