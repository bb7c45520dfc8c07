//! How the Parquet tests lay pages out: writer version, dictionary, codec, rows per page and
//! per row group, drawn by proptest, so that the page decoder and the list-length reader meet
//! the same variety of files.

use std::ops::Range;

use arrow_array::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{WriterProperties, WriterVersion};
use proptest::prelude::*;

#[derive(Debug, Clone)]
pub(super) struct PageLayout {
    pub version: WriterVersion,
    pub dictionary: bool,
    pub codec: Compression,
    /// Rows per data page and per row group.
    pub page_rows: usize,
    pub group_rows: usize,
}

impl PageLayout {
    /// Writes `batch` to `path` in this layout.
    pub fn write(&self, batch: &RecordBatch, path: &std::path::Path) {
        let properties = WriterProperties::builder()
            .set_writer_version(self.version)
            .set_dictionary_enabled(self.dictionary)
            .set_compression(self.codec)
            .set_write_batch_size(self.page_rows)
            .set_data_page_row_count_limit(self.page_rows)
            .set_max_row_group_row_count(Some(self.group_rows))
            .build();
        let file = std::fs::File::create(path).unwrap();
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(properties)).unwrap();
        writer.write(batch).unwrap();
        writer.close().unwrap();
    }
}

/// Layouts with `page_rows` and `group_rows` rows per page and per row group.
pub(super) fn page_layouts(
    page_rows: Range<usize>,
    group_rows: Range<usize>,
) -> impl Strategy<Value = PageLayout> {
    (
        prop_oneof![
            Just(WriterVersion::PARQUET_1_0),
            Just(WriterVersion::PARQUET_2_0)
        ],
        any::<bool>(),
        prop_oneof![
            Just(Compression::UNCOMPRESSED),
            Just(Compression::SNAPPY),
            Just(Compression::ZSTD(ZstdLevel::default())),
        ],
        page_rows,
        group_rows,
    )
        .prop_map(
            |(version, dictionary, codec, page_rows, group_rows)| PageLayout {
                version,
                dictionary,
                codec,
                page_rows,
                group_rows,
            },
        )
}
