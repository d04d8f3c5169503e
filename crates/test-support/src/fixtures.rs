//! The event fixtures in `proto/fixtures/events/` (canonical protobuf JSON of an `Envelope`):
//! loading one as a typed envelope for a consumer test, and comparing the shape of an emitted
//! envelope with its fixture for a producer test.

use std::{collections::BTreeSet, path::PathBuf};

use anyhow::Context as _;
use flashsale_proto::events::v1::Envelope;
use prost::Message as _;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor};

fn descriptor() -> anyhow::Result<MessageDescriptor> {
    let pool = DescriptorPool::decode(flashsale_proto::FILE_DESCRIPTOR_SET)
        .context("decode descriptors")?;
    pool.get_message_by_name("flashsale.events.v1.Envelope")
        .context("Envelope descriptor")
}

/// Where the fixtures live.
pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto/fixtures/events")
}

/// The fixture of event type `kind` (e.g. `order.created`) as JSON.
pub fn json(kind: &str) -> anyhow::Result<serde_json::Value> {
    let path = dir().join(format!("{kind}.json"));
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))
}

/// The fixture of `kind` as a typed envelope (through its protobuf encoding, as on the wire).
pub fn envelope(kind: &str) -> anyhow::Result<Envelope> {
    let value = json(kind)?;
    let msg = DynamicMessage::deserialize(descriptor()?, value)
        .with_context(|| format!("fixture {kind}"))?;
    Ok(Envelope::decode(msg.encode_to_vec().as_slice())?)
}

/// `env` as canonical protobuf JSON; with `defaults`, fields at their default value too.
pub fn to_json(env: &Envelope, defaults: bool) -> anyhow::Result<serde_json::Value> {
    let msg = DynamicMessage::decode(descriptor()?, env.encode_to_vec().as_slice())?;
    let options = prost_reflect::SerializeOptions::new().skip_default_fields(!defaults);
    let mut out = serde_json::Serializer::new(Vec::new());
    msg.serialize_with_options(&mut out, &options)?;
    Ok(serde_json::from_slice(&out.into_inner())?)
}

/// Every field path in `value` (`orderCreated.sku`, …), values ignored.
pub fn shape(value: &serde_json::Value) -> BTreeSet<String> {
    fn walk(prefix: &str, v: &serde_json::Value, out: &mut BTreeSet<String>) {
        if let serde_json::Value::Object(map) = v {
            for (k, child) in map {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.insert(path.clone());
                walk(&path, child, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk("", value, &mut out);
    out
}

/// Fails unless `emitted` has its fixture's shape: the same payload and message structure, and
/// no field set that the fixture leaves unset. (A field the fixture sets may be at its default
/// value in `emitted`: proto3 cannot tell that from unset.)
pub fn assert_same_shape(emitted: &Envelope) -> anyhow::Result<()> {
    let fixture = envelope(&emitted.r#type)?;
    let (want, have) = (
        shape(&to_json(&fixture, true)?),
        shape(&to_json(emitted, true)?),
    );
    anyhow::ensure!(
        want == have,
        "{} differs from its fixture: missing {:?}, extra {:?}",
        emitted.r#type,
        want.difference(&have).collect::<Vec<_>>(),
        have.difference(&want).collect::<Vec<_>>()
    );
    let (fixture_set, emitted_set) = (
        shape(&to_json(&fixture, false)?),
        shape(&to_json(emitted, false)?),
    );
    let unexpected: Vec<_> = emitted_set.difference(&fixture_set).collect();
    anyhow::ensure!(
        unexpected.is_empty(),
        "{} sets fields its fixture leaves unset: {unexpected:?}",
        emitted.r#type
    );
    Ok(())
}
