//! The one place each encoding is bound to the module that reads and writes it.

use super::format::ShardFormat;
use super::{array_record, arrow_ipc, jsonl, mds, megatron, msgpack, npy, parquet, tokens};
use crate::encoding::Encoding;

/// The format that reads and writes `encoding`.
pub fn format_of(encoding: Encoding) -> &'static dyn ShardFormat {
    match encoding {
        Encoding::Parquet => &parquet::Parquet,
        Encoding::Jsonl => &jsonl::JSONL,
        Encoding::JsonlGz => &jsonl::JSONL_GZ,
        Encoding::Msgpack => &msgpack::Msgpack,
        Encoding::Bin => &tokens::Bin,
        Encoding::Megatron => &megatron::Megatron,
        Encoding::Npy => &npy::Npy,
        Encoding::Arrow => &arrow_ipc::ArrowIpc,
        Encoding::Mds => &mds::Mds,
        Encoding::ArrayRecord(payload) => array_record::format(payload),
    }
}

/// The encodings token stages read, for messages (`parquet, bin, megatron and npy`); the
/// `ArrayRecord` payloads are named once, as `array_record`.
pub fn token_encodings() -> String {
    let mut names: Vec<&str> = Vec::new();
    for encoding in Encoding::ALL {
        let name = encoding.name();
        let name = name.split_once(':').map_or(name, |(family, _)| family);
        if format_of(encoding).reads_tokens() && !names.contains(&name) {
            names.push(name);
        }
    }
    match names.split_last() {
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_encoding_is_bound_to_the_format_that_names_it() {
        for encoding in Encoding::ALL {
            let format = format_of(encoding);
            assert_eq!(format.encoding(), encoding);
            assert!(
                format.reads_records() || format.reads_tokens(),
                "{} is read by no stage",
                encoding.name()
            );
        }
    }

    #[test]
    fn token_stages_read_every_format_with_token_documents() {
        assert_eq!(
            token_encodings(),
            "parquet, bin, megatron, npy, arrow, mds and array_record"
        );
        assert!(!format_of(Encoding::Bin).reads_records());
    }
}
