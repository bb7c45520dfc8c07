use super::*;
use crate::columns::{Chunk, ColumnBuf};
use crate::config::{PackingSpec, WindowsSpec, POSITIONS, SEGMENT_IDS};
use crate::formats::ShardReader;

/// A `.bin` of `ids` (uint16) with its `meta.json`, in a directory of its own.
fn bin(name: &str, ids: &[u16], meta: &str) -> String {
    let dir = std::env::temp_dir().join(format!("o41-tokens-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(META_FILE), meta).unwrap();
    let path = dir.join("t.bin");
    let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
    std::fs::write(&path, bytes).unwrap();
    path.to_string_lossy().into_owned()
}

fn projection(row: usize) -> Projection {
    let field = |source: &str| FieldSpec {
        overflow: crate::config::Overflow::Truncate,
        pad_side: crate::config::PadSide::Right,
        name: source.trim_start_matches('@').to_owned(),
        source: source.into(),
        dtype: DType::I32,
        shape: vec![row],
        pad: serde_json::Value::from(0),
    };
    Projection::new(&[field("t"), field(SEGMENT_IDS), field(POSITIONS)]).unwrap()
}

/// Every window of the shard at `uri`, as (tokens, segments, positions) rows: the tokens as
/// the reader reads them, the others as the planner writes them ([`fill_window`]).
fn windows(uri: &str, layout: &TokenLayout) -> Result<Vec<[Vec<i32>; 3]>> {
    let storage = Storage::local();
    let object = Arc::new(storage.open(uri)?);
    let how = crate::formats::TokenInspection {
        layout,
        cache: None,
    };
    let meta = inspect(
        &storage,
        &object,
        (Encoding::Bin, None),
        how,
        (&[], 1 << 20),
    )?;
    let p = projection(layout.row_tokens() as usize);
    let (records, _) = p.record_columns();
    let rows = meta.rows as usize;
    let mut chunk = Chunk::padded(&p, rows);
    let mut tokens = Chunk::padded(&records, rows);
    // Junk where the reader must write: it pads each window's tail itself.
    let len = tokens.columns[0].len();
    tokens.columns[0].fill_pad(0..len, crate::dtype::Scalar::Int(99));
    let index: Arc<TokenIndex> = meta
        .index
        .clone()
        .into_any()
        .downcast()
        .expect("a token index");
    let mut reader = Reader::open(object, index.clone(), Encoding::Bin);
    reader
        .read_ranges(
            std::slice::from_ref(&(0..meta.rows)),
            &records,
            &mut tokens,
            None,
        )
        .map_err(|f| f.error)?;
    let width = layout.row_tokens() as usize;
    chunk.columns[0] = tokens.columns.remove(0);
    let mut pieces = Vec::new();
    for w in 0..rows {
        for (k, kind) in [(1, WindowColumn::Segments), (2, WindowColumn::Positions)] {
            let out = (&mut chunk.columns[k], w * width..(w + 1) * width);
            fill_window(&index, w as u64, kind, out, 0, &mut pieces).unwrap();
        }
    }
    let column = |k: usize, w: usize| match &chunk.columns[k] {
        ColumnBuf::I32(v) => v[w * width..(w + 1) * width].to_vec(),
        _ => unreachable!("i32 columns"),
    };
    Ok((0..rows)
        .map(|w| [column(0, w), column(1, w), column(2, w)])
        .collect())
}

#[test]
fn a_bin_shard_packs_its_eos_cut_documents() {
    // Documents [5 6 0] [7 0] [8 9 10 11 12 0]; windows of 4, two open.
    let uri = bin(
        "pack",
        &[5, 6, 0, 7, 0, 8, 9, 10, 11, 12, 0],
        r#"{"dtype": "uint16", "eos_id": 0, "vocab": 13}"#,
    );
    let layout = TokenLayout::Packed(PackingSpec {
        field: "t".to_owned(),
        seq_len: 4,
        bins: 2,
        eos_id: None,
        overflow: crate::config::PackOverflow::default(),
    });
    let rows = windows(&uri, &layout).unwrap();
    assert_eq!(
        rows[0],
        [vec![8, 9, 10, 11], vec![1, 1, 1, 1], vec![0, 1, 2, 3]]
    );
    // The tail [12 0] fills the window of [7 0], which closes full before [5 6 0]'s.
    assert_eq!(
        rows[1],
        [vec![7, 0, 12, 0], vec![1, 1, 2, 2], vec![0, 1, 4, 5]]
    );
    assert_eq!(
        rows[2],
        [vec![5, 6, 0, 0], vec![1, 1, 1, 0], vec![0, 1, 2, 0]]
    );
    assert_eq!(rows.len(), 3);
}

#[test]
fn stream_windows_overlap_by_one_token() {
    let uri = bin("windows", &[1, 2, 3, 4, 5, 6], r#"{"dtype": "uint16"}"#);
    let layout = TokenLayout::Windows(WindowsSpec {
        field: "t".to_owned(),
        seq_len: 2,
        eos_id: None,
    });
    let tokens: Vec<Vec<i32>> = windows(&uri, &layout)
        .unwrap()
        .into_iter()
        .map(|[t, _, _]| t)
        .collect();
    assert_eq!(tokens, vec![vec![1, 2, 3], vec![3, 4, 5], vec![5, 6, 0]]);
}

#[test]
fn a_bad_meta_json_is_a_malformed_shard_naming_it() {
    let layout = TokenLayout::Windows(WindowsSpec {
        field: "t".to_owned(),
        seq_len: 2,
        eos_id: None,
    });
    for (name, meta) in [
        ("dtype", r#"{"dtype": "int8"}"#),
        ("json", "{not json"),
        ("missing", r#"{"eos_id": 3}"#),
    ] {
        let uri = bin(name, &[1, 2, 3], meta);
        let err = windows(&uri, &layout).unwrap_err();
        assert!(
            matches!(&err, Error::Format { path, .. } if path.ends_with(META_FILE)),
            "{name}: {err}"
        );
    }
}
