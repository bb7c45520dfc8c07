//! A source's column mapping: corpora name the same thing differently (Megatron's ids are
//! `tokens`, Hugging Face's and MDS's `input_ids`), so a source may say under which column its
//! shards hold each name the fields read. Readers never see the mapping: a mapped source is read
//! with its fields renamed ([`renamed_fields`]), so every format honours it alike.

use std::collections::BTreeMap;

use super::resolved::ResolvedSource;
use super::schema::{FieldSource, FieldSpec, SourceSpec, TokenLayout};
use crate::error::{Error, Result};

/// A source that may map names to columns: a config's and a resolved document's sources alike.
pub trait MappedSource {
    /// The mapping (empty: every name is read as it is).
    fn columns(&self) -> &BTreeMap<String, String>;
}

impl MappedSource for SourceSpec {
    fn columns(&self) -> &BTreeMap<String, String> {
        SourceSpec::columns(self)
    }
}

impl MappedSource for ResolvedSource {
    fn columns(&self) -> &BTreeMap<String, String> {
        &self.columns
    }
}

/// The names a stage's fields read from records: each field's record fields (a stack's each),
/// and the token field of a token stage. Reserved `@` sources are not read from records.
fn read_names<'a>(fields: &'a [FieldSpec], layout: Option<&'a TokenLayout>) -> Vec<&'a str> {
    let mut names: Vec<&str> = fields
        .iter()
        .flat_map(|f| f.source.parts())
        .map(String::as_str)
        .filter(|name| !name.starts_with('@'))
        .chain(layout.map(TokenLayout::field))
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// Checks the column mapping of the source at `option` against the fields of its stage:
/// every name and column is a record field's (no reserved `@` name, not empty), and every
/// name is one the stage reads (a name nothing reads is a typo that would otherwise go
/// unnoticed).
pub(super) fn validate_columns(
    option: &str,
    columns: &BTreeMap<String, String>,
    fields: &[FieldSpec],
    layout: Option<&TokenLayout>,
) -> Result<()> {
    if columns.is_empty() {
        return Ok(());
    }
    let read = read_names(fields, layout);
    for (name, column) in columns {
        let at = format!("{option}.columns['{name}']");
        for (what, value) in [("name", name), ("column", column)] {
            if value.is_empty() || value.starts_with('@') {
                return Err(Error::config(
                    &at,
                    format!(
                        "the {what} '{value}' is not a record field's: a mapping renames record \
                         fields, not reserved '@' sources"
                    ),
                ));
            }
        }
        if !read.contains(&name.as_str()) {
            return Err(Error::config(
                &at,
                format!(
                    "no field of the stage reads '{name}'; the names read are {}",
                    read.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

fn renamed(name: &str, columns: &BTreeMap<String, String>) -> String {
    columns
        .get(name)
        .map_or_else(|| name.to_owned(), Clone::clone)
}

/// `fields` as a source with `columns` reads them: each record field it maps renamed to its
/// column. Names and everything else stay, so batches are the same whatever the source.
pub fn renamed_fields(fields: &[FieldSpec], columns: &BTreeMap<String, String>) -> Vec<FieldSpec> {
    fields
        .iter()
        .map(|field| FieldSpec {
            source: match &field.source {
                FieldSource::One(name) => FieldSource::One(renamed(name, columns)),
                FieldSource::Stack(names) => {
                    FieldSource::Stack(names.iter().map(|n| renamed(n, columns)).collect())
                }
            },
            ..field.clone()
        })
        .collect()
}

/// `layout` as a source with `columns` reads it: its token field renamed.
pub fn renamed_layout(layout: &TokenLayout, columns: &BTreeMap<String, String>) -> TokenLayout {
    match layout {
        TokenLayout::Packed(p) => {
            let mut p = p.clone();
            p.field = renamed(&p.field, columns);
            TokenLayout::Packed(p)
        }
        TokenLayout::Windows(w) => {
            let mut w = w.clone();
            w.field = renamed(&w.field, columns);
            TokenLayout::Windows(w)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(name: &str, source: FieldSource) -> FieldSpec {
        serde_json::from_value(serde_json::json!({
            "name": name, "source": source.parts(), "dtype": "i32", "shape": [4],
        }))
        .map(|mut f: FieldSpec| {
            f.source = source;
            f
        })
        .unwrap()
    }

    #[test]
    fn mapped_names_are_renamed_and_the_rest_kept() {
        let fields = [
            field("ids", FieldSource::One("input_ids".into())),
            field("mask", FieldSource::One("loss_mask".into())),
            field(
                "pair",
                FieldSource::Stack(vec!["input_ids".into(), "x".into()]),
            ),
        ];
        let columns = BTreeMap::from([("input_ids".to_owned(), "tokens".to_owned())]);
        let renamed = renamed_fields(&fields, &columns);
        assert_eq!(renamed[0].source, FieldSource::One("tokens".into()));
        assert_eq!(renamed[0].name, "ids", "the delivered name stays");
        assert_eq!(renamed[1].source, FieldSource::One("loss_mask".into()));
        assert_eq!(
            renamed[2].source,
            FieldSource::Stack(vec!["tokens".into(), "x".into()])
        );
        validate_columns("s", &columns, &fields, None).unwrap();
    }

    #[test]
    fn a_name_nothing_reads_or_a_reserved_one_is_refused() {
        let fields = [field("ids", FieldSource::One("input_ids".into()))];
        let typo = BTreeMap::from([("inputids".to_owned(), "tokens".to_owned())]);
        let e = validate_columns("stages[0].sources[1]", &typo, &fields, None).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("stages[0].sources[1].columns['inputids']") && text.contains("input_ids"),
            "{text}"
        );
        let reserved = BTreeMap::from([("input_ids".to_owned(), "@row".to_owned())]);
        assert!(validate_columns("s", &reserved, &fields, None).is_err());
    }
}
