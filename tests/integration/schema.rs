//! Our protos against an independent schema: every field we declare that
//! Perfetto v51 (the `perfetto_protos` crate) also has must agree in name,
//! type, label and packing, throughout the messages reachable from TraceConfig
//! and TracePacket. Fields newer than v51 are not compared.

use std::collections::HashSet;

use perfetto_protos::trace_config::TraceConfig as PTraceConfig;
use perfetto_protos::trace_packet::TracePacket as PTracePacket;
use prost_reflect::Kind;
use protobuf::MessageFull;
use protobuf::reflect::{RuntimeFieldType, RuntimeType};

fn their_message(
    f: &protobuf::reflect::FieldDescriptor,
) -> Option<protobuf::reflect::MessageDescriptor> {
    match f.runtime_field_type() {
        RuntimeFieldType::Singular(RuntimeType::Message(m))
        | RuntimeFieldType::Repeated(RuntimeType::Message(m)) => Some(m),
        _ => None,
    }
}

fn compare(
    ours: &prost_reflect::MessageDescriptor,
    theirs: &protobuf::reflect::MessageDescriptor,
    seen: &mut HashSet<String>,
    problems: &mut Vec<String>,
) {
    if !seen.insert(ours.full_name().to_string()) {
        return;
    }
    for f in ours.fields() {
        let Some(t) = theirs.field_by_number(f.number()) else {
            continue;
        };
        let where_ = format!("{}.{} = {}", ours.full_name(), f.name(), f.number());
        if f.name() != t.name() {
            problems.push(format!("{where_}: theirs is named {}", t.name()));
        }
        let our_type = f.field_descriptor_proto().r#type.unwrap_or(0);
        let their_type = protobuf::Enum::value(&t.proto().type_());
        // previous_packet_dropped was a bool up to v51 and became a uint32
        // bitmask later (ARCHITECTURE.md §7.2); both are varints, and 1 reads as true.
        let widened = where_ == "perfetto.protos.TracePacket.previous_packet_dropped = 42";
        if our_type != their_type && !widened {
            problems.push(format!("{where_}: type {our_type}, theirs {their_type}"));
        }
        let their_repeated = t.proto().label()
            == protobuf::descriptor::field_descriptor_proto::Label::LABEL_REPEATED;
        if f.is_list() != their_repeated {
            problems.push(format!(
                "{where_}: repeated {} vs {their_repeated}",
                f.is_list()
            ));
        }
        if f.is_list() && f.is_packed() != t.proto().options.packed() {
            problems.push(format!(
                "{where_}: packed {} vs {}",
                f.is_packed(),
                t.proto().options.packed()
            ));
        }
        if let (Kind::Message(om), Some(tm)) = (f.kind(), their_message(&t)) {
            compare(&om, &tm, seen, problems);
        }
    }
}

#[test]
fn our_schema_agrees_with_perfetto_v51() {
    let pool = recorder::config::pool();
    let mut problems = Vec::new();
    let mut seen = HashSet::new();
    for (ours, theirs) in [
        ("perfetto.protos.TraceConfig", PTraceConfig::descriptor()),
        ("perfetto.protos.TracePacket", PTracePacket::descriptor()),
    ] {
        let ours = pool.get_message_by_name(ours).expect("declared");
        compare(&ours, &theirs, &mut seen, &mut problems);
    }
    assert!(seen.len() > 50, "walked only {} messages", seen.len());
    assert!(
        problems.is_empty(),
        "{} mismatches:\n{}",
        problems.len(),
        problems.join("\n")
    );
}
