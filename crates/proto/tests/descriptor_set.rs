//! The encoded descriptor set is what reflection serves and what gateways load: it must be
//! self-contained, name every service, and describe the refusal details exactly as the
//! services encode them (tonic-types).

#![allow(clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};

use prost::Message as _;
use prost_types::{DescriptorProto, FileDescriptorSet};

fn contract() -> FileDescriptorSet {
    FileDescriptorSet::decode(flashsale_proto::FILE_DESCRIPTOR_SET).expect("contract decodes")
}

/// Fully qualified message name → descriptor, nested messages included.
fn messages(set: &FileDescriptorSet, package: &str) -> BTreeMap<String, DescriptorProto> {
    fn walk(prefix: &str, msg: &DescriptorProto, out: &mut BTreeMap<String, DescriptorProto>) {
        let name = format!("{prefix}.{}", msg.name());
        for nested in &msg.nested_type {
            walk(&name, nested, out);
        }
        out.insert(name, msg.clone());
    }
    let mut out = BTreeMap::new();
    for file in set.file.iter().filter(|f| f.package() == package) {
        for msg in &file.message_type {
            walk(file.package(), msg, &mut out);
        }
    }
    out
}

#[test]
fn every_import_is_in_the_set() {
    let set = contract();
    let names: BTreeSet<&str> = set.file.iter().map(|f| f.name()).collect();
    for file in &set.file {
        for dep in &file.dependency {
            assert!(
                names.contains(dep.as_str()),
                "{} imports {dep}, which the set lacks",
                file.name()
            );
        }
    }
    for expected in [
        "google/rpc/status.proto",
        "google/rpc/error_details.proto",
        "google/protobuf/any.proto",
        "google/protobuf/duration.proto",
        "google/protobuf/timestamp.proto",
    ] {
        assert!(names.contains(expected), "the set lacks {expected}");
    }
}

#[test]
fn service_names_are_the_services_in_the_set() {
    let set = contract();
    let in_set: BTreeSet<String> = set
        .file
        .iter()
        .flat_map(|f| {
            f.service
                .iter()
                .map(move |s| format!("{}.{}", f.package(), s.name()))
        })
        .collect();
    let listed: BTreeSet<String> = flashsale_proto::SERVICE_NAMES
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    assert_eq!(in_set, listed);
    assert!(listed.contains("flashsale.order.v1.OrderService"));
}

#[test]
fn vendored_error_details_match_the_types_the_services_encode() {
    let ours = messages(&contract(), "google.rpc");
    let theirs = messages(
        &FileDescriptorSet::decode(tonic_types::pb::FILE_DESCRIPTOR_SET)
            .expect("tonic-types' set decodes"),
        "google.rpc",
    );
    assert!(theirs.contains_key("google.rpc.ErrorInfo"), "{theirs:?}");
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>()
    );
    let shape = |m: &DescriptorProto| {
        m.field
            .iter()
            .map(|f| {
                (
                    f.number(),
                    f.name().to_owned(),
                    f.r#type(),
                    f.label(),
                    f.type_name().to_owned(),
                )
            })
            .collect::<Vec<_>>()
    };
    for (name, msg) in &ours {
        assert_eq!(shape(msg), shape(&theirs[name]), "{name} differs");
    }
}
