//! The standard AWS credential chain, looked at in the AWS SDKs' order: the environment's keys,
//! a web identity token file named by the environment, the shared config and credentials files
//! (a profile's keys, web identity or `credential_process`), container credentials, and instance
//! metadata. Only where to get credentials is decided here; fetching is `credentials.rs`.

use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::SystemTime;

use object_store::aws::AmazonS3ConfigKey as Key;

use super::keys::{FetchCredentials, TemporaryCredentials};
use crate::error::{Error, Result};

/// The most a `credential_process` may print: its answer is a few hundred bytes of JSON.
const MAX_PROCESS_OUTPUT: u64 = 1 << 20;
/// The most of a shared config or credentials file read.
const MAX_PROFILE_FILE: u64 = 16 << 20;

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
    let mut settings = section(config_path.as_ref(), &config_section)?.or(if name == "default" {
        None
    } else {
        // Some tools write `[name]` in the config file too.
        section(config_path.as_ref(), &name)?
    });
    if let Some(keys) = section(credentials_path.as_ref(), &name)? {
        settings.get_or_insert_with(HashMap::new).extend(keys);
    }
    if let Some(settings) = settings {
        let what = format!("profile '{name}'");
        if let Some(source) = profile_source(&what, &settings, env("AWS_ENDPOINT_URL_STS"))? {
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
    })
}

fn web_identity(
    what: &str,
    file: String,
    role: String,
    session: Option<String>,
    sts: Option<String>,
) -> ChainSource {
    let mut keys = vec![(Key::WebIdentityTokenFile, file), (Key::RoleArn, role)];
    keys.extend(session.map(|s| (Key::RoleSessionName, s)));
    keys.extend(sts.map(|s| (Key::StsEndpoint, s)));
    ChainSource::Delegated {
        what: what.to_owned(),
        keys,
    }
}

/// What one profile's settings say to use; `None` when they name no credentials.
fn profile_source(
    what: &str,
    settings: &HashMap<String, String>,
    sts: Option<String>,
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
            file,
            role,
            get("role_session_name"),
            sts,
        )));
    }
    if let Some(command) = get("credential_process") {
        return Ok(Some(ChainSource::Process(CredentialProcess {
            what: format!("credential_process of {what}"),
            argv: split_command(&command).ok_or_else(|| {
                Error::config("credential_process", format!("{what}: unbalanced quotes"))
            })?,
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

/// The `key = value` pairs of `[name]` in an INI file; `None` when the file or section is absent.
fn section(path: Option<&PathBuf>, name: &str) -> Result<Option<HashMap<String, String>>> {
    let Some(path) = path else { return Ok(None) };
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(&path.display().to_string(), e)),
    };
    let mut text = String::new();
    file.take(MAX_PROFILE_FILE)
        .read_to_string(&mut text)
        .map_err(|e| Error::io(&path.display().to_string(), e))?;
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
    Ok(found)
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

/// A profile's `credential_process`: a program printing version 1 credential JSON.
pub(super) struct CredentialProcess {
    what: String,
    argv: Vec<String>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ProcessAnswer {
    version: u32,
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
    expiration: Option<String>,
}

impl FetchCredentials for CredentialProcess {
    fn fetch(&self) -> Result<TemporaryCredentials> {
        let fail = |message: String| {
            Error::config("credential_process", format!("{}: {message}", self.what))
        };
        let (program, args) = self
            .argv
            .split_first()
            .ok_or_else(|| fail("the command is empty".into()))?;
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| fail(format!("could not start '{program}': {e}")))?;
        let mut out = Vec::new();
        let read = child
            .stdout
            .take()
            .expect("stdout is piped")
            .take(MAX_PROCESS_OUTPUT + 1)
            .read_to_end(&mut out);
        let status = child.wait().map_err(|e| fail(e.to_string()))?;
        read.map_err(|e| fail(e.to_string()))?;
        if !status.success() {
            return Err(fail(format!("it exited with {status}")));
        }
        if out.len() as u64 > MAX_PROCESS_OUTPUT {
            return Err(fail(format!(
                "it printed more than {MAX_PROCESS_OUTPUT} bytes"
            )));
        }
        // Not echoed on failure: the output holds secrets.
        let answer: ProcessAnswer = serde_json::from_slice(&out).map_err(|e| {
            fail(format!(
                "its output is not credential JSON (line {}, column {})",
                e.line(),
                e.column()
            ))
        })?;
        if answer.version != 1 {
            return Err(fail(format!(
                "its output has Version {}, expected 1",
                answer.version
            )));
        }
        let expiry = answer
            .expiration
            .map(|text| {
                chrono::DateTime::parse_from_rfc3339(&text)
                    .map(SystemTime::from)
                    .map_err(|e| fail(format!("Expiration '{text}' is not an RFC 3339 time ({e})")))
            })
            .transpose()?;
        Ok(TemporaryCredentials {
            access_key_id: answer.access_key_id,
            secret_access_key: answer.secret_access_key,
            session_token: answer.session_token,
            expiry,
        })
    }
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
            ChainSource::Delegated { what, keys } => {
                assert!(what.contains("profile 'wi'"), "{what}");
                assert!(keys.contains(&(Key::WebIdentityTokenFile, "/t".to_owned())));
            }
            _ => panic!("expected web identity"),
        }
        match chain_source_in(Some("proc"), &env).unwrap() {
            ChainSource::Process(p) => assert_eq!(p.argv, ["/bin/my tool", "--flag", "a b"]),
            _ => panic!("expected a process"),
        }
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
            let dir = std::env::temp_dir().join(format!("o41-prop-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let file = dir.join("config");
            std::fs::write(&file, &text).unwrap();
            if let Ok(Some(settings)) = section(Some(&file), &name) {
                let _ = profile_source("profile", &settings, None);
            }
        }
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
