//! The standard AWS credential chain, looked at in the AWS SDKs' order: the environment's keys,
//! a web identity token file named by the environment, the shared config and credentials files
//! (a profile's keys, web identity or `credential_process`), container credentials, and instance
//! metadata. Only where to get credentials is decided here; fetching is `credentials.rs`, running
//! a `credential_process` is `process.rs`, and the files read are bounded by `chain_files.rs`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use object_store::aws::AmazonS3ConfigKey as Key;

use super::chain_files::{self, FileFault, MAX_PROFILE_FILE};
use super::keys::TemporaryCredentials;
use super::process::{self, CredentialProcess};
use crate::error::{Error, Result};

/// Where the chain found credentials.
pub(super) enum ChainSource {
    /// Keys, from the environment or a profile.
    Keys(TemporaryCredentials),
    /// A profile's `credential_process`.
    Process(CredentialProcess),
    /// One of `object_store`'s providers, configured by these keys.
    Delegated {
        what: String,
        keys: Vec<(Key, String)>,
        /// The files it reads, each with the setting that names it: checked before each fetch
        /// (`chain_files::check`), as `object_store` reads them whole and blocking.
        files: Vec<(String, String)>,
    },
}

/// Looks the chain through with the process environment.
pub(super) fn chain_source(profile: Option<&str>) -> Result<ChainSource> {
    chain_source_in(profile, &|name| {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    })
}

/// The chain with `env` as the environment.
pub(super) fn chain_source_in(
    profile: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ChainSource> {
    // An explicit profile means that profile, as with the AWS SDKs: the environment's keys and
    // web identity are for a process that named none.
    if profile.is_none() {
        if let (Some(key), Some(secret)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"))
        {
            return Ok(ChainSource::Keys(TemporaryCredentials {
                access_key_id: key,
                secret_access_key: secret,
                session_token: env("AWS_SESSION_TOKEN"),
                expiry: None,
            }));
        }
        if let (Some(file), Some(role)) = (env("AWS_WEB_IDENTITY_TOKEN_FILE"), env("AWS_ROLE_ARN"))
        {
            return Ok(web_identity(
                "web identity (AWS_WEB_IDENTITY_TOKEN_FILE)",
                "AWS_WEB_IDENTITY_TOKEN_FILE",
                file,
                role,
                env("AWS_ROLE_SESSION_NAME"),
                env("AWS_ENDPOINT_URL_STS"),
            ));
        }
    }
    let explicit = profile.is_some();
    let name = profile
        .map(str::to_owned)
        .or_else(|| env("AWS_PROFILE"))
        .unwrap_or_else(|| "default".to_owned());
    let home = env("HOME").map(PathBuf::from);
    let config_path = env("AWS_CONFIG_FILE")
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| h.join(".aws/config")));
    let credentials_path = env("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| h.join(".aws/credentials")));
    let config_section = if name == "default" {
        "default".to_owned()
    } else {
        format!("profile {name}")
    };
    let config = profile_file(config_path.as_deref(), "AWS_CONFIG_FILE")?;
    let credentials = profile_file(credentials_path.as_deref(), "AWS_SHARED_CREDENTIALS_FILE")?;
    let config = config.as_deref().unwrap_or("");
    let mut settings = section(config, &config_section).or(if name == "default" {
        None
    } else {
        // Some tools write `[name]` in the config file too.
        section(config, &name)
    });
    if let Some(keys) = section(credentials.as_deref().unwrap_or(""), &name) {
        settings.get_or_insert_with(HashMap::new).extend(keys);
    }
    if let Some(settings) = settings {
        let what = format!("profile '{name}'");
        let outside = Outside {
            sts: env("AWS_ENDPOINT_URL_STS"),
            process_timeout: env(process::TIMEOUT_VARIABLE),
        };
        if let Some(source) = profile_source(&what, &settings, outside)? {
            return Ok(source);
        }
    } else if explicit || env("AWS_PROFILE").is_some() {
        let shown =
            |p: Option<&PathBuf>| p.map_or("(no HOME)".to_owned(), |p| p.display().to_string());
        return Err(Error::config(
            "profile",
            format!(
                "profile '{name}' is in neither {} nor {}",
                shown(config_path.as_ref()),
                shown(credentials_path.as_ref())
            ),
        ));
    }
    if let Some(uri) = env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") {
        return Ok(ChainSource::Delegated {
            what: "container credentials (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI)".into(),
            keys: vec![(Key::ContainerCredentialsRelativeUri, uri)],
            files: Vec::new(),
        });
    }
    if let Some(uri) = env("AWS_CONTAINER_CREDENTIALS_FULL_URI") {
        let Some(token) = env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE") else {
            return Err(Error::config(
                "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "is set without AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE, which the container \
                 credential endpoint needs",
            ));
        };
        return Ok(ChainSource::Delegated {
            what: "container credentials (AWS_CONTAINER_CREDENTIALS_FULL_URI)".into(),
            files: vec![(
                "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE".into(),
                token.clone(),
            )],
            keys: vec![
                (Key::ContainerCredentialsFullUri, uri),
                (Key::ContainerAuthorizationTokenFile, token),
            ],
        });
    }
    if env("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Err(Error::config(
            "credentials",
            format!(
                "no AWS credentials found: none given, none in AWS_ACCESS_KEY_ID/\
                 AWS_SECRET_ACCESS_KEY, no AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN, no \
                 usable profile '{name}' in the shared config or credentials files, no container \
                 credentials, and instance metadata is disabled (AWS_EC2_METADATA_DISABLED); pass \
                 access_key_id and secret_access_key, a profile, or a credential_provider"
            ),
        ));
    }
    let mut keys = Vec::new();
    if let Some(endpoint) = env("AWS_EC2_METADATA_SERVICE_ENDPOINT") {
        keys.push((Key::MetadataEndpoint, endpoint));
    }
    Ok(ChainSource::Delegated {
        what: "instance metadata (the last link of the AWS credential chain: no keys, web \
               identity, profile or container credentials were found)"
            .into(),
        keys,
        files: Vec::new(),
    })
}

/// Web identity: `setting` names the token file in messages.
fn web_identity(
    what: &str,
    setting: &str,
    file: String,
    role: String,
    session: Option<String>,
    sts: Option<String>,
) -> ChainSource {
    let files = vec![(setting.to_owned(), file.clone())];
    let mut keys = vec![(Key::WebIdentityTokenFile, file), (Key::RoleArn, role)];
    keys.extend(session.map(|s| (Key::RoleSessionName, s)));
    keys.extend(sts.map(|s| (Key::StsEndpoint, s)));
    ChainSource::Delegated {
        what: what.to_owned(),
        keys,
        files,
    }
}

/// What a profile's source takes from the environment.
#[derive(Default)]
struct Outside {
    /// `AWS_ENDPOINT_URL_STS`.
    sts: Option<String>,
    /// `O41_CREDENTIAL_PROCESS_TIMEOUT`.
    process_timeout: Option<String>,
}

/// What one profile's settings say to use; `None` when they name no credentials.
fn profile_source(
    what: &str,
    settings: &HashMap<String, String>,
    outside: Outside,
) -> Result<Option<ChainSource>> {
    let get = |k: &str| settings.get(k).filter(|v| !v.is_empty()).cloned();
    if let (Some(key), Some(secret)) = (get("aws_access_key_id"), get("aws_secret_access_key")) {
        return Ok(Some(ChainSource::Keys(TemporaryCredentials {
            access_key_id: key,
            secret_access_key: secret,
            session_token: get("aws_session_token"),
            expiry: None,
        })));
    }
    if let (Some(file), Some(role)) = (get("web_identity_token_file"), get("role_arn")) {
        return Ok(Some(web_identity(
            &format!("web identity ({what})"),
            "web_identity_token_file",
            file,
            role,
            get("role_session_name"),
            outside.sts,
        )));
    }
    if let Some(command) = get("credential_process") {
        return Ok(Some(ChainSource::Process(CredentialProcess {
            what: format!("credential_process of {what}"),
            argv: split_command(&command).ok_or_else(|| {
                Error::config("credential_process", format!("{what}: unbalanced quotes"))
            })?,
            timeout: process::timeout_from(outside.process_timeout)?,
        })));
    }
    for key in [
        "sso_session",
        "sso_start_url",
        "source_profile",
        "credential_source",
        "role_arn",
    ] {
        if settings.contains_key(key) {
            return Err(Error::config(
                "profile",
                format!(
                    "{what} gets its credentials through '{key}', which this library does not \
                     follow itself; pass credential_provider= a function returning them (for \
                     example from boto3's Session(profile_name=...).get_credentials())"
                ),
            ));
        }
    }
    Ok(None)
}

/// The text of a shared config or credentials file (`setting` names it in messages); `None`
/// when there is no path or no file.
fn profile_file(path: Option<&Path>, setting: &str) -> Result<Option<String>> {
    let Some(path) = path else { return Ok(None) };
    let bytes = match chain_files::read(path, "shared config or credentials file", MAX_PROFILE_FILE)
    {
        Ok(bytes) => bytes,
        Err(FileFault::Missing) => return Ok(None),
        Err(FileFault::Refused(message)) => return Err(Error::config(setting, message)),
        Err(FileFault::Io(e)) => return Err(Error::io(&path.display().to_string(), e)),
    };
    String::from_utf8(bytes).map(Some).map_err(|e| {
        Error::config(
            setting,
            format!(
                "{} is not UTF-8 text (byte {}), so not a shared config or credentials file",
                path.display(),
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

/// The `key = value` pairs of `[name]` in an INI file's text; `None` when the section is absent.
fn section(text: &str, name: &str) -> Option<HashMap<String, String>> {
    let mut found: Option<HashMap<String, String>> = None;
    let mut inside = false;
    for line in text.lines() {
        // Indented lines continue a nested setting (`s3 =` then `  max_concurrent_requests`).
        if line.starts_with([' ', '\t']) {
            continue;
        }
        let line = line.trim();
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        if let Some(header) = line.strip_prefix('[') {
            let header = header.split(']').next().unwrap_or("").trim();
            let header = header.split_whitespace().collect::<Vec<_>>().join(" ");
            inside = header == name;
            if inside {
                found.get_or_insert_with(HashMap::new);
            }
            continue;
        }
        if inside {
            if let Some((key, value)) = line.split_once('=') {
                found
                    .get_or_insert_with(HashMap::new)
                    .insert(key.trim().to_ascii_lowercase(), value.trim().to_owned());
            }
        }
    }
    found
}

/// A command line split as a POSIX shell would split words, quotes and backslashes included;
/// `None` when a quote is left open.
fn split_command(command: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = command.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => words.extend(word.take()),
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next()? {
                        '\'' => break,
                        c => w.push(c),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => w.push(chars.next()?),
                        c => w.push(c),
                    }
                }
            }
            '\\' => word.get_or_insert_with(String::new).push(chars.next()?),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    Some(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, String)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn keys(source: ChainSource) -> (String, Option<String>) {
        match source {
            ChainSource::Keys(k) => (k.access_key_id, k.session_token),
            _ => panic!("expected keys"),
        }
    }

    #[test]
    fn the_chain_takes_the_environment_then_web_identity_then_profiles() {
        let dir = std::env::temp_dir().join(format!("o41-profiles-{}", std::process::id()));
        std::fs::create_dir_all(dir.join(".aws")).unwrap();
        std::fs::write(
            dir.join(".aws/credentials"),
            "[default]\naws_access_key_id = AKDEFAULT\naws_secret_access_key = s\n\n\
             [train]\naws_access_key_id=AKTRAIN\naws_secret_access_key=s\naws_session_token=T\n",
        )
        .unwrap();
        std::fs::write(
            dir.join(".aws/config"),
            "[profile wi]\nrole_arn = arn:aws:iam::1:role/r\nweb_identity_token_file = /t\n\
             s3 =\n  max_concurrent_requests = 4\n[profile sso]\nsso_session = x\n\
             [profile proc]\ncredential_process = \"/bin/my tool\" --flag 'a b'\n",
        )
        .unwrap();
        let home = ("HOME", dir.display().to_string());
        let env = env_of(&[
            home.clone(),
            ("AWS_ACCESS_KEY_ID", "AKENV".into()),
            ("AWS_SECRET_ACCESS_KEY", "s".into()),
        ]);
        assert_eq!(keys(chain_source_in(None, &env).unwrap()).0, "AKENV");
        // An explicit profile skips the environment's keys.
        assert_eq!(
            keys(chain_source_in(Some("train"), &env).unwrap()),
            ("AKTRAIN".into(), Some("T".into()))
        );
        let env = env_of(&[
            home.clone(),
            ("AWS_WEB_IDENTITY_TOKEN_FILE", "/tok".into()),
            ("AWS_ROLE_ARN", "arn:aws:iam::1:role/x".into()),
        ]);
        assert!(matches!(
            chain_source_in(None, &env).unwrap(),
            ChainSource::Delegated { keys, .. } if keys.len() == 2
        ));
        let env = env_of(std::slice::from_ref(&home));
        assert_eq!(keys(chain_source_in(None, &env).unwrap()).0, "AKDEFAULT");
        match chain_source_in(Some("wi"), &env).unwrap() {
            ChainSource::Delegated { what, keys, files } => {
                assert!(what.contains("profile 'wi'"), "{what}");
                assert!(keys.contains(&(Key::WebIdentityTokenFile, "/t".to_owned())));
                assert_eq!(files, [("web_identity_token_file".into(), "/t".into())]);
            }
            _ => panic!("expected web identity"),
        }
        match chain_source_in(Some("proc"), &env).unwrap() {
            ChainSource::Process(p) => {
                assert_eq!(p.argv, ["/bin/my tool", "--flag", "a b"]);
                assert_eq!(p.timeout, process::DEFAULT_TIMEOUT);
            }
            _ => panic!("expected a process"),
        }
        let timed = env_of(&[home.clone(), (process::TIMEOUT_VARIABLE, "0.25".into())]);
        match chain_source_in(Some("proc"), &timed).unwrap() {
            ChainSource::Process(p) => assert_eq!(p.timeout.as_millis(), 250),
            _ => panic!("expected a process"),
        }
        let wrong = env_of(&[home.clone(), (process::TIMEOUT_VARIABLE, "soon".into())]);
        let error = chain_source_in(Some("proc"), &wrong)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("O41_CREDENTIAL_PROCESS_TIMEOUT"), "{error}");
        let error = chain_source_in(Some("sso"), &env)
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("sso_session") && error.contains("credential_provider"),
            "{error}"
        );
        let error = chain_source_in(Some("nope"), &env)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("profile 'nope' is in neither"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
        // Nothing anywhere: instance metadata, unless it is turned off.
        let bare = env_of(&[("HOME", "/nonexistent-o41".into())]);
        assert!(matches!(
            chain_source_in(None, &bare).unwrap(),
            ChainSource::Delegated { what, .. } if what.starts_with("instance metadata")
        ));
        let off = env_of(&[
            ("HOME", "/nonexistent-o41".into()),
            ("AWS_EC2_METADATA_DISABLED", "true".into()),
        ]);
        let error = chain_source_in(None, &off).err().unwrap().to_string();
        assert!(error.contains("no AWS credentials found"), "{error}");
    }

    proptest::proptest! {
        // Shared files and credential_process lines are whatever a user's machine holds: any
        // text parses to an answer or a clean error, never a panic.
        #[test]
        fn any_profile_text_and_command_line_parse_without_panicking(
            text in "(\\PC|\n|\t|\\[|\\]|=|#|;| ){0,200}",
            name in "[a-z \\[\\]]{0,12}",
        ) {
            let _ = split_command(&text);
            if let Some(settings) = section(&text, &name) {
                let _ = profile_source("profile", &settings, Outside::default());
            }
        }
    }

    #[test]
    fn shared_files_must_be_small_regular_files_and_never_block() {
        let dir = std::env::temp_dir().join(format!("o41-profile-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let big = dir.join("big");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_PROFILE_FILE + 1)
            .unwrap();
        let home = ("HOME", dir.display().to_string());
        for (variable, path, says) in [
            (
                "AWS_CONFIG_FILE",
                fifo.clone(),
                "is a FIFO, not a regular file",
            ),
            (
                "AWS_SHARED_CREDENTIALS_FILE",
                fifo.clone(),
                "is a FIFO, not a regular file",
            ),
            (
                "AWS_CONFIG_FILE",
                PathBuf::from("/dev/zero"),
                "is a character device, not a regular file",
            ),
            (
                "AWS_CONFIG_FILE",
                dir.clone(),
                "is a directory, not a regular file",
            ),
            (
                "AWS_CONFIG_FILE",
                big.clone(),
                "is 16777217 bytes, more than the 16777216 bytes a shared config or \
                 credentials file may be",
            ),
        ] {
            let env = env_of(&[home.clone(), (variable, path.display().to_string())]);
            let error = chain_source_in(None, &env).err().unwrap().to_string();
            assert_eq!(
                error
                    .split_once(" (a shared")
                    .map_or(error.as_str(), |(head, _)| head),
                format!("invalid {variable}: {} {says}", path.display()),
            );
        }
        std::fs::write(dir.join("latin1"), b"[default]\n# caf\xe9\n").unwrap();
        let env = env_of(&[
            home,
            ("AWS_CONFIG_FILE", dir.join("latin1").display().to_string()),
        ]);
        let error = chain_source_in(None, &env).err().unwrap().to_string();
        assert!(error.contains("is not UTF-8 text (byte 15)"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn commands_split_like_a_shell() {
        assert_eq!(
            split_command(r#"a "b c" 'd e' f\ g"#).unwrap(),
            ["a", "b c", "d e", "f g"]
        );
        assert!(split_command("a 'b").is_none());
    }
}
