//! Static bearer tokens in kube-apiserver's `--token-auth-file` format.
//!
//! One CSV record a line: `token,user,uid[,"group1,group2"]`. The groups
//! column is optional; it is one column, so it must be quoted when it lists
//! more than one group (fields follow RFC 4180 quoting: `"` opens a quoted
//! field, `""` inside it is a literal quote). Empty lines are skipped, as
//! upstream's CSV reader skips them.
//!
//! Stricter than upstream, which warns and carries on: a line with an empty
//! token or user, a token that appears twice, and a line with more than four
//! columns (upstream silently drops the fifth, which is usually an unquoted
//! second group) are errors naming the line.
//!
//! Tokens are kept only as SHA-256 digests, and looked up by digest, so the
//! lookup time does not depend on how much of a guessed token is right.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

use sha2::{Digest, Sha256};

use super::{AuthConfigError, UserInfo};

/// A user named in a tokens file (without `system:authenticated`, which the
/// authenticator adds).
pub type TokenEntry = UserInfo;

/// The parsed tokens file: token digest → user.
#[derive(Clone, Default)]
pub struct TokenFile {
    users: HashMap<[u8; 32], TokenEntry>,
}

impl fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenFile")
            .field("tokens", &self.users.len())
            .finish()
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl TokenFile {
    /// Reads and parses the file at `path`; errors name the path and line.
    pub fn load(path: impl AsRef<Path>) -> Result<TokenFile, AuthConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| AuthConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses tokens-file text; `source_name` is used in error messages.
    pub fn parse(text: &str, source_name: &str) -> Result<TokenFile, AuthConfigError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut users = HashMap::new();
        let mut first_seen: HashMap<[u8; 32], usize> = HashMap::new();
        for (index, raw) in text.split('\n').enumerate() {
            let line = index + 1;
            let err = |message: String| AuthConfigError::TokenLine {
                source_name: source_name.to_string(),
                line,
                message,
            };
            let record = raw.strip_suffix('\r').unwrap_or(raw);
            if record.is_empty() {
                continue;
            }
            let (token, user) = parse_record(record).map_err(err)?;
            let key = digest(&token);
            match first_seen.entry(key) {
                Entry::Occupied(first) => {
                    return Err(err(format!(
                        "duplicate token (first on line {}); every token must be unique",
                        first.get()
                    )));
                }
                Entry::Vacant(v) => {
                    v.insert(line);
                }
            }
            users.insert(key, user);
        }
        Ok(TokenFile { users })
    }

    /// The user `token` belongs to.
    pub fn lookup(&self, token: &str) -> Option<&TokenEntry> {
        self.users.get(&digest(token))
    }

    pub fn len(&self) -> usize {
        self.users.len()
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }
}

impl FromStr for TokenFile {
    type Err = AuthConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text, "token file")
    }
}

fn parse_record(record: &str) -> Result<(String, TokenEntry), String> {
    let columns = split_csv(record)?;
    if columns.len() < 3 {
        return Err(format!(
            "expected at least 3 columns (token,user,uid), found {}",
            columns.len()
        ));
    }
    if columns.len() > 4 {
        return Err(format!(
            "expected at most 4 columns (token,user,uid,groups), found {}; quote the groups column when it lists several groups: \"group1,group2\"",
            columns.len()
        ));
    }
    let mut columns = columns.into_iter();
    let token = columns.next().unwrap_or_default();
    let name = columns.next().unwrap_or_default();
    let uid = columns.next().unwrap_or_default();
    let groups = columns.next().unwrap_or_default();
    if token.is_empty() {
        return Err("column 1 (token) is empty".into());
    }
    if token.chars().any(char::is_whitespace) {
        return Err(
            "column 1 (token) contains whitespace, which an Authorization: Bearer header cannot carry"
                .into(),
        );
    }
    if name.is_empty() {
        return Err("column 2 (user) is empty".into());
    }
    let groups = groups
        .split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(String::from)
        .collect();
    Ok((token, UserInfo { name, uid, groups }))
}

/// Splits one CSV record (no line breaks inside quoted fields).
fn split_csv(record: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut chars = record.chars().peekable();
    loop {
        let column = fields.len() + 1;
        let mut field = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    None => {
                        return Err(format!(
                            "column {column}: quoted field has no closing quote (a field cannot span lines)"
                        ));
                    }
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        field.push('"');
                    }
                    Some('"') => break,
                    Some(c) => field.push(c),
                }
            }
            fields.push(field);
            match chars.next() {
                None => return Ok(fields),
                Some(',') => {}
                Some(c) => {
                    return Err(format!(
                        "column {column}: unexpected {c:?} after the closing quote; a quoted field must end at a comma or the end of the line"
                    ));
                }
            }
        } else {
            loop {
                match chars.next() {
                    None => {
                        fields.push(field);
                        return Ok(fields);
                    }
                    Some(',') => {
                        fields.push(field);
                        break;
                    }
                    Some('"') => {
                        return Err(format!(
                            "column {column}: bare \" in an unquoted field; quote the whole field and double the quote"
                        ));
                    }
                    Some(c) => field.push(c),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line_error(text: &str) -> (usize, String) {
        match text.parse::<TokenFile>().unwrap_err() {
            AuthConfigError::TokenLine { line, message, .. } => (line, message),
            other => panic!("unexpected error {other:?}"),
        }
    }

    #[test]
    fn parses_groups_column_quoted_and_optional() {
        let f: TokenFile =
            "t1,alice,1,\"team-a,trainhub:admins\"\nt2,bob,2\n\nt3,carol,3,solo\r\n\"t,4\",dave,4,\n"
                .parse()
                .unwrap();
        assert_eq!(f.len(), 4);
        let alice = f.lookup("t1").unwrap();
        assert_eq!(alice.name, "alice");
        assert_eq!(alice.uid, "1");
        assert_eq!(alice.groups, vec!["team-a", "trainhub:admins"]);
        assert!(f.lookup("t2").unwrap().groups.is_empty());
        assert_eq!(f.lookup("t3").unwrap().groups, vec!["solo"]);
        // A quoted token may hold a comma, and a trailing empty groups column is no group.
        assert_eq!(f.lookup("t,4").unwrap().name, "dave");
        assert!(f.lookup("t,4").unwrap().groups.is_empty());
        assert!(f.lookup("t").is_none());
        assert!(f.lookup("T1").is_none());
    }

    #[test]
    fn quoted_field_with_doubled_quote() {
        let f: TokenFile = "tok,\"o\"\"brien\",7".parse().unwrap();
        assert_eq!(f.lookup("tok").unwrap().name, "o\"brien");
    }

    #[test]
    fn byte_order_mark_is_ignored() {
        let f: TokenFile = "\u{feff}tok,alice,1".parse().unwrap();
        assert!(f.lookup("tok").is_some());
    }

    #[test]
    fn too_few_columns_names_the_line() {
        let (line, message) = line_error("t1,alice,1\n\nt2,bob\n");
        assert_eq!(line, 3);
        assert_eq!(
            message,
            "expected at least 3 columns (token,user,uid), found 2"
        );
    }

    #[test]
    fn unquoted_groups_are_refused() {
        let (line, message) = line_error("t1,alice,1,g1,g2");
        assert_eq!(line, 1);
        assert!(
            message.starts_with("expected at most 4 columns"),
            "{message}"
        );
        assert!(message.contains("\"group1,group2\""), "{message}");
    }

    #[test]
    fn duplicate_token_names_both_lines() {
        let (line, message) = line_error("t1,alice,1\nt2,bob,2\nt1,carol,3\n");
        assert_eq!(line, 3);
        assert_eq!(
            message,
            "duplicate token (first on line 1); every token must be unique"
        );
    }

    #[test]
    fn empty_token_and_user_are_refused() {
        assert_eq!(line_error(",alice,1").1, "column 1 (token) is empty");
        assert_eq!(line_error("t,,1").1, "column 2 (user) is empty");
        assert!(line_error("a b,alice,1").1.contains("whitespace"));
        // A whitespace-only line is a record, not an empty line.
        assert_eq!(line_error("t,alice,1\n  \n").0, 2);
    }

    #[test]
    fn malformed_quotes_are_refused() {
        let (line, message) = line_error("t1,alice,1\nt2,bob,2,\"g1,g2\n");
        assert_eq!(line, 2);
        assert!(message.contains("column 4"), "{message}");
        assert!(message.contains("no closing quote"), "{message}");
        assert!(
            line_error("t2,bob,2,\"g1\"x")
                .1
                .contains("after the closing quote")
        );
        assert!(line_error("t2,b\"ob,2").1.contains("bare \""));
    }

    #[test]
    fn load_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.csv");
        std::fs::write(&path, "t1,alice,1\nbroken\n").unwrap();
        let e = TokenFile::load(&path).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "{}: line 2: expected at least 3 columns (token,user,uid), found 1",
                path.display()
            )
        );
        let missing = TokenFile::load(dir.path().join("nope")).unwrap_err();
        assert!(matches!(missing, AuthConfigError::Read { .. }));
    }

    #[test]
    fn debug_does_not_show_tokens() {
        let f: TokenFile = "secret-token,alice,1".parse().unwrap();
        let shown = format!("{f:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(!shown.contains("alice"), "{shown}");
    }
}
