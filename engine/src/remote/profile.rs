//! The store's endpoint and credentials the standard AWS way: environment variables first,
//! then the profile (`AWS_PROFILE`, else `default`) in the shared credentials file
//! (`AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`) and the config file
//! (`AWS_CONFIG_FILE`, else `~/.aws/config`), as the AWS CLI reads them.
//!
//! The files are INI as botocore reads them: `[section]` headers, `key = value` lines
//! (keys without case), whole-line comments after `#` or `;`, and a key with no value
//! followed by indented `key = value` lines as its subsection (`s3 =` then
//! `  endpoint_url = ...`). The credentials file names a profile `[NAME]`; the config
//! file `[default]` or `[profile NAME]`, and `[services NAME]` for per-service settings a
//! profile takes with `services = NAME`.
//!
//! From a profile riffle takes `aws_access_key_id`, `aws_secret_access_key` and
//! `aws_session_token` (the credentials file first, then the config file), `region`, and
//! the endpoint: `endpoint_url` of the `s3` subsection of its services section or of the
//! profile itself, else the profile's `endpoint_url`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::S3Config;
use crate::{Error, Result};

/// One INI file as read: its sections in order, each with its keys (a subsection's as
/// `parent.key`), lower-cased.
#[derive(Debug, Default, PartialEq)]
struct Ini {
    sections: Vec<(String, Vec<(String, String)>)>,
}

impl Ini {
    /// The keys of section `name` (every section of that name, merged in file order).
    fn section(&self, name: &str) -> Option<Vec<(&str, &str)>> {
        let mut keys = None::<Vec<(&str, &str)>>;
        for (s, kv) in &self.sections {
            if s == name {
                keys.get_or_insert_with(Vec::new)
                    .extend(kv.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            }
        }
        keys
    }
}

/// The value of `key` in `keys` (the last one given, as botocore keeps).
fn get<'a>(keys: &[(&str, &'a str)], key: &str) -> Option<&'a str> {
    keys.iter()
        .rev()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| *v)
        .filter(|v| !v.is_empty())
}

/// Parses `text`, the contents of `file` (named in errors with the line).
fn parse(text: &str, file: &Path) -> Result<Ini> {
    let bad = |n: usize, what: String| Error::BadInput {
        path: file.to_path_buf(),
        offset: None,
        what: format!("line {}: {what}", n + 1),
    };
    let mut ini = Ini::default();
    // The key a following indented line belongs to, when it had no value.
    let mut parent: Option<String> = None;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let indented = raw.starts_with([' ', '\t']);
        if let Some(head) = line.strip_prefix('[') {
            let Some(name) = head.strip_suffix(']') else {
                return Err(bad(
                    n,
                    format!("a section header without its `]`: {line:?}"),
                ));
            };
            let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
            if name.is_empty() {
                return Err(bad(n, "a section header with no name".into()));
            }
            ini.sections.push((name, Vec::new()));
            parent = None;
            continue;
        }
        let Some((section, keys)) = ini.sections.last_mut() else {
            return Err(bad(
                n,
                format!("{line:?} comes before any [section] header"),
            ));
        };
        let Some((key, value)) = line.split_once('=') else {
            return Err(bad(
                n,
                format!("expected `key = value` in [{section}], found {line:?}"),
            ));
        };
        let key = key.trim().to_ascii_lowercase();
        let value = value.trim().to_string();
        if key.is_empty() {
            return Err(bad(
                n,
                format!("a value with no key in [{section}]: {line:?}"),
            ));
        }
        match (&parent, indented) {
            (Some(p), true) => keys.push((format!("{p}.{key}"), value)),
            _ => {
                parent = value.is_empty().then(|| key.clone());
                keys.push((key, value));
            }
        }
    }
    Ok(ini)
}

/// Reads and parses `file`; an empty INI when it does not exist (as the AWS CLI).
fn read(file: &Path) -> Result<Ini> {
    match std::fs::read(file) {
        Ok(bytes) => {
            let text = String::from_utf8(bytes).map_err(|e| Error::BadInput {
                path: file.to_path_buf(),
                offset: Some(e.utf8_error().valid_up_to() as u64),
                what: "not UTF-8 text".into(),
            })?;
            parse(&text, file)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Ini::default()),
        Err(e) => Err(Error::io(file, "read", None, e)),
    }
}

/// What riffle takes from one profile.
#[derive(Debug, Default, PartialEq)]
struct Profile {
    /// Access key, secret and session token, when the profile has both key and secret.
    credentials: Option<(String, String, Option<String>)>,
    region: Option<String>,
    endpoint: Option<String>,
}

/// The credentials of `keys`, when it has both key and secret.
fn credentials(keys: &[(&str, &str)]) -> Option<(String, String, Option<String>)> {
    let key = get(keys, "aws_access_key_id")?;
    let secret = get(keys, "aws_secret_access_key")?;
    let token = get(keys, "aws_session_token").map(str::to_string);
    Some((key.into(), secret.into(), token))
}

/// Profile `name` from the credentials file `creds` and the config file `config`, or
/// `None` when neither has it.
fn profile(name: &str, creds: &Ini, config: &Ini) -> Option<Profile> {
    let in_creds = creds.section(name);
    let in_config = match name {
        "default" => config
            .section("default")
            .or_else(|| config.section("profile default")),
        _ => config.section(&format!("profile {name}")),
    };
    if in_creds.is_none() && in_config.is_none() {
        return None;
    }
    let (in_creds, in_config) = (in_creds.unwrap_or_default(), in_config.unwrap_or_default());
    let services = get(&in_config, "services")
        .and_then(|s| config.section(&format!("services {s}")))
        .unwrap_or_default();
    let endpoint = get(&services, "s3.endpoint_url")
        .or_else(|| get(&in_config, "s3.endpoint_url"))
        .or_else(|| get(&in_config, "endpoint_url"));
    Some(Profile {
        credentials: credentials(&in_creds).or_else(|| credentials(&in_config)),
        region: get(&in_config, "region").map(str::to_string),
        endpoint: endpoint.map(str::to_string),
    })
}

/// `path` with a leading `~/` as the home directory.
fn expand(path: &str, home: Option<&str>) -> PathBuf {
    match (path.strip_prefix("~/"), home) {
        (Some(rest), Some(h)) => Path::new(h).join(rest),
        _ => PathBuf::from(path),
    }
}

/// The store's configuration from the environment `var` (a variable's non-empty value)
/// and the AWS profile it names: a variable beats the profile's setting. An unreadable or
/// malformed file is an error naming it and the line; so is `AWS_PROFILE` naming a
/// profile neither file has (the default profile may be missing).
pub(super) fn config(var: &dyn Fn(&str) -> Option<String>) -> Result<S3Config> {
    let first = |keys: &[&str]| keys.iter().find_map(|k| var(k));
    let home = var("HOME");
    let file = |key: &str, default: &str| {
        var(key)
            .map(|p| expand(&p, home.as_deref()))
            .or_else(|| home.as_ref().map(|h| Path::new(h).join(default)))
    };
    let creds_file = file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
    let config_file = file("AWS_CONFIG_FILE", ".aws/config");
    let creds = creds_file
        .as_deref()
        .map(read)
        .transpose()?
        .unwrap_or_default();
    let conf = config_file
        .as_deref()
        .map(read)
        .transpose()?
        .unwrap_or_default();
    let named = first(&["AWS_PROFILE", "AWS_DEFAULT_PROFILE"]);
    let name = named.as_deref().unwrap_or("default");
    let p = match profile(name, &creds, &conf) {
        Some(p) => p,
        None if named.is_none() => Profile::default(),
        None => {
            let shown = |f: &Option<PathBuf>| {
                f.as_ref()
                    .map_or("(no HOME)".into(), |p| p.display().to_string())
            };
            return Err(Error::Invalid(format!(
                "AWS_PROFILE names the profile `{name}`, which neither {} nor {} has",
                shown(&creds_file),
                shown(&config_file)
            )));
        }
    };
    // Keys in the environment are taken whole by the store's own chain, as the CLI does.
    let credentials = match first(&["AWS_ACCESS_KEY_ID"]) {
        Some(_) => None,
        None => p.credentials,
    };
    let (credentials, session_token) = match credentials {
        Some((k, s, t)) => (Some((k, s)), t),
        None => (None, None),
    };
    Ok(S3Config {
        endpoint: first(&["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"])
            .or(p.endpoint),
        credentials,
        session_token,
        region: first(&["AWS_REGION", "AWS_DEFAULT_REGION"]).or(p.region),
        retry_timeout: var("RIFFLE_S3_RETRY_SECONDS")
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ini(text: &str) -> Ini {
        parse(text, Path::new("f")).unwrap()
    }

    #[test]
    fn sections_keys_comments_and_subsections_parse() {
        let i = ini(
            "# a comment\n; another\n\n[default]\nRegion = eu-west-1\n  \n\
             [profile b]\ns3 =\n  endpoint_url = http://h:9\n\taddressing_style = path\n\
             region=us-east-2\n",
        );
        assert_eq!(i.section("default").unwrap(), vec![("region", "eu-west-1")]);
        assert_eq!(
            i.section("profile b").unwrap(),
            vec![
                ("s3", ""),
                ("s3.endpoint_url", "http://h:9"),
                ("s3.addressing_style", "path"),
                ("region", "us-east-2"),
            ]
        );
        assert_eq!(i.section("b"), None);
        // A header's inner spaces are one.
        assert!(ini("[profile   x ]\n").section("profile x").is_some());
    }

    #[test]
    fn a_malformed_file_is_an_error_naming_it_and_the_line() {
        for (text, line, what) in [
            ("[default]\nregion eu\n", 2, "expected `key = value`"),
            ("region = eu\n", 1, "before any [section]"),
            ("[default]\n[profile x\n", 2, "without its `]`"),
            ("[ ]\n", 1, "no name"),
            ("[default]\n = v\n", 2, "no key"),
        ] {
            let err = parse(text, Path::new("/x/config")).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("/x/config: line {line}: ")) && err.contains(what),
                "{text:?}: {err}"
            );
        }
    }

    /// The configuration from `vars` and files `credentials` and `config` written in a
    /// temporary directory (named by the variables unless `vars` names them).
    fn with_files(vars: &[(&str, &str)], credentials: &str, config: &str) -> Result<S3Config> {
        let dir = tempfile::tempdir().unwrap();
        let c = dir.path().join("credentials");
        let f = dir.path().join("config");
        std::fs::write(&c, credentials).unwrap();
        std::fs::write(&f, config).unwrap();
        let mut all: Vec<(String, String)> = vec![
            (
                "AWS_SHARED_CREDENTIALS_FILE".into(),
                c.display().to_string(),
            ),
            ("AWS_CONFIG_FILE".into(), f.display().to_string()),
        ];
        all.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        super::config(&|k| {
            all.iter()
                .rev()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        })
    }

    const CREDS: &str = "[default]\naws_access_key_id = DK\naws_secret_access_key = DS\n\n\
                         [dev]\naws_access_key_id = K\naws_secret_access_key = S\n\
                         aws_session_token = T\n";
    const CONFIG: &str = "[default]\nregion = eu-west-1\nendpoint_url = http://default:1\n\n\
                          [profile dev]\nregion = us-west-2\nservices = local\n\
                          endpoint_url = http://global:2\n\n\
                          [services local]\ns3 =\n  endpoint_url = http://s3only:3\n\n\
                          [profile keys-here]\naws_access_key_id = CK\n\
                          aws_secret_access_key = CS\ns3 =\n  endpoint_url = http://nested:4\n";

    #[test]
    fn the_default_or_named_profile_gives_keys_region_and_endpoint() {
        let c = with_files(&[], CREDS, CONFIG).unwrap();
        assert_eq!(c.credentials, Some(("DK".into(), "DS".into())));
        assert_eq!(c.session_token, None);
        assert_eq!(c.region.as_deref(), Some("eu-west-1"));
        assert_eq!(c.endpoint.as_deref(), Some("http://default:1"));
        // The services section's s3 endpoint beats the profile's own.
        let c = with_files(&[("AWS_PROFILE", "dev")], CREDS, CONFIG).unwrap();
        assert_eq!(c.credentials, Some(("K".into(), "S".into())));
        assert_eq!(c.session_token.as_deref(), Some("T"));
        assert_eq!(c.region.as_deref(), Some("us-west-2"));
        assert_eq!(c.endpoint.as_deref(), Some("http://s3only:3"));
        // Keys in the config file, and an s3 subsection in the profile.
        let c = with_files(&[("AWS_PROFILE", "keys-here")], CREDS, CONFIG).unwrap();
        assert_eq!(c.credentials, Some(("CK".into(), "CS".into())));
        assert_eq!(c.endpoint.as_deref(), Some("http://nested:4"));
        assert_eq!(c.region, None);
    }

    #[test]
    fn environment_variables_beat_the_profile() {
        let vars = [
            ("AWS_PROFILE", "dev"),
            ("AWS_ACCESS_KEY_ID", "EK"),
            ("AWS_REGION", "ap-south-1"),
            ("AWS_ENDPOINT_URL", "http://env:5"),
            ("RIFFLE_S3_RETRY_SECONDS", "2.5"),
        ];
        let c = with_files(&vars, CREDS, CONFIG).unwrap();
        // The environment's keys are the store's own to read, with their own token.
        assert_eq!((c.credentials, c.session_token), (None, None));
        assert_eq!(c.region.as_deref(), Some("ap-south-1"));
        assert_eq!(c.endpoint.as_deref(), Some("http://env:5"));
        assert_eq!(c.retry_timeout, Some(Duration::from_millis(2500)));
    }

    #[test]
    fn a_missing_named_profile_is_an_error_and_a_missing_default_is_not() {
        let err = with_files(&[("AWS_PROFILE", "nope")], CREDS, CONFIG)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`nope`") && err.contains("credentials") && err.contains("config"),
            "{err}"
        );
        // Neither file, nor a default profile in them: the environment alone.
        let c = with_files(&[("AWS_CONFIG_FILE", "/nonexistent/c")], "[dev]\n", "").unwrap();
        assert_eq!((c.credentials, c.endpoint, c.region), (None, None, None));
        // A config file's `[dev]` is not the profile dev (it needs `[profile dev]`).
        let err = with_files(&[("AWS_PROFILE", "dev")], "", "[dev]\nregion = x\n");
        assert!(err.is_err());
    }

    #[test]
    fn a_malformed_profile_file_fails_the_configuration() {
        let err = with_files(&[], "[default]\naws_access_key_id\n", "")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("credentials: line 2") && err.contains("aws_access_key_id"),
            "{err}"
        );
    }
}
