//! The check of a checkpoint against a config: the first part of the stream they describe
//! differently, named by its option path, without reading any shard or manifest.

use crate::config::{ResolvedConfig, ResolvedSource, SourceSpec, StreamConfig};
use crate::encoding::Encoding;
use crate::error::{Error, Result};
use crate::formats::format_of;
use crate::storage::normalize as absolute;

/// Refuses `resolved` (a checkpoint's) when `config` would not resolve to the same stream,
/// naming the first part that differs. Compares what the config says, without reading any
/// shard or manifest: the fields, the seed, each stage's settings and each source's weight,
/// file list and encodings or manifest selection. Row counts are checked when the shards are
/// reopened; rank, world size and resources (threads, prefetch, memory limit) are not compared.
pub fn check_config(resolved: &ResolvedConfig, config: &StreamConfig) -> Result<()> {
    config.validate()?;
    match first_difference(resolved, config)? {
        None => Ok(()),
        Some(difference) => Err(Error::Checkpoint {
            message: format!(
                "it was taken from another stream than this config describes: {difference}"
            ),
        }),
    }
}

/// "`option` is X in the checkpoint, Y in the config" when they differ.
fn differs<T: PartialEq + serde::Serialize>(option: &str, theirs: &T, ours: &T) -> Option<String> {
    (theirs != ours).then(|| {
        format!(
            "{option} is {} in the checkpoint, {} in the config",
            show(theirs),
            show(ours)
        )
    })
}

fn first_difference(resolved: &ResolvedConfig, config: &StreamConfig) -> Result<Option<String>> {
    if let Some(d) = differs(
        "the number of fields",
        &resolved.fields.len(),
        &config.fields.len(),
    ) {
        return Ok(Some(d));
    }
    for (i, (theirs, ours)) in resolved.fields.iter().zip(&config.fields).enumerate() {
        if let Some(d) = differs(&format!("fields[{i}]"), theirs, ours) {
            return Ok(Some(d));
        }
    }
    if let Some(d) = differs("seed", &resolved.seed, &config.seed)
        .or_else(|| {
            differs(
                "validation_pass",
                &resolved.validation_pass,
                &config.validation_pass,
            )
        })
        .or_else(|| differs("partitions", &resolved.partitions, &config.partitions))
        .or_else(|| {
            differs(
                "the number of stages",
                &resolved.stages.len(),
                &config.stages.len(),
            )
        })
    {
        return Ok(Some(d));
    }
    for (s, (theirs, ours)) in resolved.stages.iter().zip(&config.stages).enumerate() {
        let option = format!("stages[{s}]");
        let stage = differs(
            &format!("{option}.batch_size"),
            &theirs.batch_size,
            &ours.batch_size,
        )
        .or_else(|| differs(&format!("{option}.shuffle"), &theirs.shuffle, &ours.shuffle))
        .or_else(|| {
            differs(
                &format!("{option}.infinite"),
                &theirs.infinite,
                &ours.infinite,
            )
        })
        .or_else(|| differs(&format!("{option}.ramp"), &theirs.ramp, &ours.ramp))
        .or_else(|| differs(&format!("{option}.packing"), &theirs.packing, &ours.packing))
        .or_else(|| differs(&format!("{option}.windows"), &theirs.windows, &ours.windows))
        .or_else(|| {
            differs(
                &format!("the number of {option}.sources"),
                &theirs.sources.len(),
                &ours.sources.len(),
            )
        });
        if stage.is_some() {
            return Ok(stage);
        }
        for (j, (theirs, ours)) in theirs.sources.iter().zip(&ours.sources).enumerate() {
            let option = format!("{option}.sources[{j}]");
            if let Some(d) = differs(&format!("{option}.weight"), &theirs.weight, &ours.weight())
                .or_else(|| {
                    differs(
                        &format!("{option}.columns"),
                        &theirs.columns,
                        ours.columns(),
                    )
                })
            {
                return Ok(Some(d));
            }
            if let Some(difference) = source_difference(theirs, ours, &option)? {
                return Ok(Some(difference));
            }
        }
    }
    Ok(None)
}

fn source_difference(
    theirs: &ResolvedSource,
    ours: &SourceSpec,
    option: &str,
) -> Result<Option<String>> {
    let selection_in_checkpoint = &theirs.manifest;
    match (ours, selection_in_checkpoint) {
        (SourceSpec::Files { .. }, Some(pinned)) => Ok(Some(format!(
            "{option} read split '{}' of {} in the checkpoint; the config lists files",
            pinned.split, pinned.manifest_uri
        ))),
        (SourceSpec::Manifest { .. }, None) => Ok(Some(format!(
            "{option} read a file list in the checkpoint; the config names a manifest"
        ))),
        (SourceSpec::Manifest { .. }, Some(pinned)) => {
            let wanted = ours.manifest_selection();
            Ok((Some(pinned) != wanted.as_ref()).then(|| {
                format!(
                    "{option} selects {} in the config, {} in the checkpoint",
                    show(&wanted),
                    show(pinned)
                )
            }))
        }
        (
            SourceSpec::Files {
                files, encoding, ..
            },
            None,
        ) => file_list_difference(theirs, files, encoding.as_deref(), option),
    }
}

/// The first difference between the file list a config names and the one a checkpoint's source
/// read, entry by entry: each entry must name what it named then (a Megatron dataset by its
/// `.idx`, `.bin` or prefix, a dataset directory), stand for the same shards and read them with
/// the same encoding.
fn file_list_difference(
    theirs: &ResolvedSource,
    files: &[String],
    encoding: Option<&str>,
    option: &str,
) -> Result<Option<String>> {
    let changed = format!("{option}: the file list changed");
    if let Some(named) = &theirs.named {
        if named.len() != files.len() {
            return Ok(Some(format!(
                "{changed}: the checkpoint's source named {} files, the config lists {}",
                named.len(),
                files.len()
            )));
        }
    }
    let shards = &theirs.shards;
    let expected = files
        .iter()
        .enumerate()
        .map(|(f, file)| match encoding {
            Some(name) => Encoding::parse(name, &format!("{option}.encoding")),
            None => Encoding::from_path(file, &format!("{option}.files[{f}]")),
        })
        .collect::<Result<Vec<_>>>()?;
    let one_each = theirs.named.is_none()
        && files
            .iter()
            .zip(&expected)
            .all(|(file, &encoding)| !format_of(encoding).names_directory(file));
    if one_each && files.len() != shards.len() {
        return Ok(Some(format!(
            "{changed}: the checkpoint read {} files, the config lists {}",
            shards.len(),
            files.len()
        )));
    }
    let mut next = 0usize;
    for (f, (file, &expected)) in files.iter().zip(&expected).enumerate() {
        let path = absolute(file);
        let count = match theirs.named.as_ref().map(|named| &named[f]) {
            Some(named) if named.file != path => {
                return Ok(Some(format!(
                    "{changed}: files[{f}] is {path} in the config, {} in the checkpoint",
                    named.file
                )));
            }
            Some(named) => usize::try_from(named.shards).unwrap_or(usize::MAX),
            // A document from before names were recorded: a directory stands for the shards
            // under it, any other entry for the one shard it is known by.
            None if format_of(expected).names_directory(file) => {
                let under = format!("{}/", path.trim_end_matches('/'));
                shards[next.min(shards.len())..]
                    .iter()
                    .take_while(|shard| shard.path.starts_with(&under))
                    .count()
                    .max(1)
            }
            None => 1,
        };
        let Some(group) = next
            .checked_add(count)
            .and_then(|end| shards.get(next..end))
        else {
            return Ok(Some(format!(
                "{changed}: the checkpoint read {} files, the config names more",
                shards.len()
            )));
        };
        if theirs.named.is_none() && !format_of(expected).names_directory(file) {
            let location = absolute(&format_of(expected).shard_location(file));
            if group[0].path != location {
                return Ok(Some(format!(
                    "{changed}: files[{f}] is {location} in the config, {} in the checkpoint",
                    group[0].path
                )));
            }
        } else if theirs.named.is_none()
            && !group[0]
                .path
                .starts_with(&format!("{}/", path.trim_end_matches('/')))
        {
            return Ok(Some(format!(
                "{changed}: files[{f}] is {path} in the config, {} in the checkpoint",
                group[0].path
            )));
        }
        if let Some(shard) = group.iter().find(|shard| shard.encoding != expected) {
            return Ok(Some(format!(
                "{option}: files[{f}] is read as {} in the config, as {} in the checkpoint",
                expected.name(),
                shard.encoding.name()
            )));
        }
        next += count;
    }
    Ok((next != shards.len()).then(|| {
        format!(
            "{changed}: the checkpoint read {} files, the config lists {}",
            shards.len(),
            next
        )
    }))
}

/// A value as compact JSON, for messages.
fn show<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}
