use super::*;
use crate::encoding::Encoding;
use crate::error::{Error, Result};
use crate::fnv::Fnv1a;

fn minimal(extra: &str) -> String {
    format!(
        r#"{{"fields":[{{"name":"t","source":"x","dtype":"i32","shape":[4]}}],
            "stages":[{{"sources":[{{"kind":"files","files":["a.parquet"]}}],"batch_size":2}}]{extra}}}"#
    )
}

/// The fingerprint as first specified: the whole document through `Value`.
fn reference_fingerprint(config: &ResolvedConfig) -> String {
    let mut doc = serde_json::json!({
        "fields": config.fields,
        "stages": config.stages,
        "seed": config.seed,
    });
    if config.validation_pass {
        doc["validation_pass"] = serde_json::Value::Bool(true);
    }
    if !config.skip_batches.is_empty() {
        doc["skip_batches"] = serde_json::json!(config.skip_batches);
    }
    if config.partitions != 1 {
        doc["partitions"] = serde_json::json!(config.partitions);
    }
    if config.partition_layout != 1 {
        doc["partition_layout"] = serde_json::json!(config.partition_layout);
    }
    let mut hash = Fnv1a::default();
    hash.update(doc.to_string().as_bytes());
    format!("fnv1a64:{:016x}", hash.value())
}

#[test]
fn streamed_fingerprint_equals_the_canonical_document_hash() {
    let shard = |k: usize| ResolvedShard {
        path: format!("/d/\"q\"\\é\u{1}/part-{k}.parquet"),
        encoding: if k.is_multiple_of(2) {
            Encoding::Parquet
        } else {
            Encoding::JsonlGz
        },
        rows: 1_000 + k as u64,
        version: k.is_multiple_of(3).then(|| format!("\"etag-{k}\"")),
        bytes: (k % 2 == 1).then_some(k as u64 * 7),
        sha256: (k % 4 == 1).then(|| "ab".repeat(32)),
    };
    let source = |w: f64, n: usize, manifest: bool| ResolvedSource {
        weight: w,
        shards: (0..n).map(shard).collect(),
        manifest: manifest.then(|| ManifestSelection {
            manifest_uri: "s3://b/m.json".into(),
            split: "train".into(),
            curriculum_stages: Some(vec!["a".into(), "\u{0}b".into()]),
        }),
        named: None,
        columns: std::collections::BTreeMap::new(),
    };
    let config = ResolvedConfig {
        version: RESOLVED_CONFIG_VERSION,
        fields: StreamConfig::from_json(&minimal("")).unwrap().fields,
        stages: vec![
            ResolvedStage {
                sources: vec![source(0.75, 9, true), source(1.0 / 3.0, 1, false)],
                batch_size: 8,
                shuffle: Some(ShuffleSpec {
                    buffer_rows: 64,
                    unit_rows: Some(4),
                    block_rows: None,
                }),
                infinite: true,
                ramp: Some(RampSpec {
                    start: 2,
                    increment: 2,
                    rows: 100,
                }),
                packing: None,
                windows: None,
            },
            ResolvedStage {
                sources: vec![source(2.0, 4, false)],
                batch_size: 3,
                shuffle: None,
                infinite: false,
                ramp: None,
                packing: Some(PackingSpec {
                    field: "tokens".into(),
                    seq_len: 16,
                    bins: 4,
                    eos_id: Some(0),
                    overflow: crate::config::PackOverflow::default(),
                }),
                windows: None,
            },
        ],
        seed: 42,
        threads: 2,
        prefetch_batches: 1,
        rank: 0,
        world_size: 1,
        memory_limit_bytes: None,
        validation_pass: false,
        partitions: 1,
        partition_layout: 1,
        skip_batches: Vec::new(),
    };
    assert_eq!(config.fingerprint(), reference_fingerprint(&config));
    let mut validation = config.clone();
    validation.validation_pass = true;
    assert_eq!(validation.fingerprint(), reference_fingerprint(&validation));
    assert_ne!(validation.fingerprint(), config.fingerprint());
    let mut skipping = config.clone();
    skipping.skip_batches = vec![[8, 16], [40, 41]];
    assert_eq!(skipping.fingerprint(), reference_fingerprint(&skipping));
    assert_ne!(skipping.fingerprint(), config.fingerprint());
    let mut other = config.clone();
    other.stages[0].sources[0].shards[3].rows += 1;
    assert_ne!(other.fingerprint(), config.fingerprint());
    // A partition layout is part of the order, so of the fingerprint; layout 1 is left out, so
    // documents written before layout 2 keep theirs.
    let mut dealt = config.clone();
    dealt.partitions = 4;
    let mut shared = dealt.clone();
    shared.partition_layout = 2;
    assert_eq!(dealt.fingerprint(), reference_fingerprint(&dealt));
    assert_eq!(shared.fingerprint(), reference_fingerprint(&shared));
    assert_ne!(shared.fingerprint(), dealt.fingerprint());
    assert!(!serde_json::to_string(&dealt)
        .unwrap()
        .contains("partition_layout"));
    let mut unknown = config.clone();
    unknown.partition_layout = 3;
    let err = unknown.validate().unwrap_err();
    assert!(
        err.to_string().contains("partition_layout") && err.to_string().contains("layout 3"),
        "{err}"
    );
}

#[test]
fn defaults_apply() {
    let config = StreamConfig::from_json(&minimal("")).unwrap();
    assert_eq!(config.threads, 4);
    assert_eq!(config.world_size, 1);
    assert_eq!(config.fields[0].pad, serde_json::Value::from(0));
}

#[test]
fn errors_name_the_option() {
    let err = StreamConfig::from_json(&minimal(r#","rank":2,"world_size":2"#)).unwrap_err();
    assert!(err.to_string().starts_with("invalid rank"), "{err}");
    let err = StreamConfig::from_json(&minimal(r#","threads":0"#)).unwrap_err();
    assert!(err.to_string().contains("threads"), "{err}");
}

#[test]
fn values_serde_refuses_are_named_by_their_path() {
    let err =
        StreamConfig::from_json(&minimal("").replace(r#""batch_size":2"#, r#""batch_size":-3"#))
            .unwrap_err();
    assert!(
        matches!(&err, Error::Config { option, .. } if option == "stages[0].batch_size"),
        "{err}"
    );
    let err = StreamConfig::from_json(&minimal(r#","seed":18446744073709551616"#)).unwrap_err();
    assert!(
        matches!(&err, Error::Config { option, .. } if option == "seed"),
        "{err}"
    );
}

#[test]
fn a_ramp_must_reach_batch_size_and_split_over_the_ranks() {
    let with = |ramp: &str, extra: &str| {
        let text = minimal(extra).replace(
            r#""batch_size":2"#,
            &format!(r#""batch_size":12,"ramp":{ramp}"#),
        );
        StreamConfig::from_json(&text)
    };
    let ok = r#"{"start":4,"increment":4,"rows":100}"#;
    assert!(with(ok, r#","world_size":2"#).is_ok());
    let option = |r: Result<StreamConfig>| match r.unwrap_err() {
        Error::Config { option, .. } => option,
        other => panic!("{other}"),
    };
    assert_eq!(option(with(ok, r#","world_size":8"#)), "stages[0].ramp");
    let cases = [
        (
            r#"{"start":0,"increment":4,"rows":100}"#,
            "stages[0].ramp.start",
        ),
        (
            r#"{"start":12,"increment":4,"rows":100}"#,
            "stages[0].ramp.start",
        ),
        (
            r#"{"start":4,"increment":5,"rows":100}"#,
            "stages[0].ramp.increment",
        ),
        (
            r#"{"start":4,"increment":4,"rows":0}"#,
            "stages[0].ramp.rows",
        ),
        (r#"{"start":4,"increment":4}"#, "stages[0].ramp"),
    ];
    for (ramp, expected) in cases {
        assert_eq!(option(with(ramp, "")), expected, "{ramp}");
    }
}

#[test]
fn a_validation_pass_reads_finite_unshuffled_stages() {
    let pass = r#","validation_pass":true"#;
    assert!(StreamConfig::from_json(&minimal(pass)).is_ok());
    let infinite = minimal(pass).replace(r#""batch_size":2"#, r#""batch_size":2,"infinite":true"#);
    let err = StreamConfig::from_json(&infinite).unwrap_err();
    assert!(err.to_string().contains("stages[0].infinite"), "{err}");
    let named = minimal(pass).replace(r#""name":"t""#, r#""name":"valid""#);
    let err = StreamConfig::from_json(&named).unwrap_err();
    assert!(err.to_string().contains("fields[0].name"), "{err}");
}

#[test]
fn pad_must_fit_the_dtype() {
    let text = minimal("").replace(r#""shape":[4]"#, r#""shape":[4],"pad":1.5"#);
    let err = StreamConfig::from_json(&text).unwrap_err();
    assert!(err.to_string().contains("fields[0].pad"), "{err}");
}
