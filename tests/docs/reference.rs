//! The book's reference pages, rendered from what polyarch itself reads: the clap
//! definition of its command line and the JSON Schemas it prints with `polyarch schema`.

use serde_norway::Value;
use std::fmt::Write;

/// Written at the top of every generated page, so no one edits it by hand.
fn generated_by(source: &str) -> String {
    format!(
        "<!-- Generated from {source} by tests/docs.rs: edit that, then run `make docs-gen`. -->\n\n"
    )
}

/// `docs/src/reference/commands.md`: every command, its arguments and flags.
pub fn commands_page(mut cli: clap::Command) -> String {
    // Fills in the subcommands' bin names (`polyarch build`) and the help flags.
    cli.build();
    let mut out = generated_by("src/cli/args.rs");
    out.push_str("# Commands\n\n");
    if let Some(about) = cli.get_about() {
        writeln!(out, "{about}\n").unwrap();
    }
    out.push_str(
        "Every command also takes `-h`/`--help`; `polyarch --version` prints the version. \
         The same text is in `polyarch COMMAND --help` and the man page (`polyarch man`).\n\n",
    );
    out.push_str("| command | what it does |\n|---|---|\n");
    let commands: Vec<&clap::Command> = cli
        .get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
        .collect();
    for command in &commands {
        let name = format!("polyarch {}", command.get_name());
        let about = command
            .get_about()
            .map(|a| a.to_string())
            .unwrap_or_default();
        writeln!(
            out,
            "| [`{name}`](#{}) | {} |",
            name.replace(' ', "-"),
            cell(&about)
        )
        .unwrap();
    }
    if let Some(after) = cli.get_after_help() {
        writeln!(out, "\n```text\n{after}\n```\n").unwrap();
    }
    for command in commands {
        command_section(&mut out, "polyarch", command);
    }
    one_final_newline(out)
}

/// One command's section, then one per subcommand (`polyarch buildx build`).
fn command_section(out: &mut String, parent: &str, command: &clap::Command) {
    let name = format!("{parent} {}", command.get_name());
    writeln!(out, "## {name}\n").unwrap();
    if let Some(about) = command.get_long_about().or(command.get_about()) {
        writeln!(out, "{about}\n").unwrap();
    }
    let usage = command.clone().render_usage().to_string();
    writeln!(out, "```text\n{usage}\n```\n").unwrap();
    let shown = |arg: &&clap::Arg| {
        !arg.is_hide_set() && !matches!(arg.get_id().as_str(), "help" | "version")
    };
    let positionals: Vec<&clap::Arg> = command.get_positionals().filter(shown).collect();
    if !positionals.is_empty() {
        out.push_str("Arguments:\n\n");
        for arg in positionals {
            argument(out, arg);
        }
        out.push('\n');
    }
    let options: Vec<&clap::Arg> = command.get_opts().filter(shown).collect();
    let flags: Vec<&clap::Arg> = command
        .get_arguments()
        .filter(|a| !a.is_positional() && !a.get_action().takes_values())
        .filter(shown)
        .collect();
    if !options.is_empty() || !flags.is_empty() {
        out.push_str("Options:\n\n");
        // In clap's declaration order, as `--help` lists them.
        for arg in command
            .get_arguments()
            .filter(|a| !a.is_positional())
            .filter(shown)
        {
            argument(out, arg);
        }
        out.push('\n');
    }
    if let Some(after) = command.get_after_help() {
        writeln!(out, "```text\n{after}\n```\n").unwrap();
    }
    for sub in command
        .get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
    {
        command_section(out, &name, sub);
    }
}

/// One bullet: the spelling, then the help, the accepted values, the default and the
/// environment variable.
fn argument(out: &mut String, arg: &clap::Arg) {
    let spelling = match (arg.get_short(), arg.get_long()) {
        _ if arg.is_positional() => format!("`{}`", value_names(arg).join(" ")),
        (short, long) => {
            let mut names = Vec::new();
            if let Some(short) = short {
                names.push(format!("-{short}"));
            }
            if let Some(long) = long {
                names.push(format!("--{long}"));
            }
            let value = if arg.get_action().takes_values() {
                format!(" {}", value_names(arg).join(" "))
            } else {
                String::new()
            };
            format!("`{}{value}`", names.join(", "))
        }
    };
    let mut sentences = Vec::new();
    if let Some(help) = arg.get_long_help().or(arg.get_help()) {
        // A help of several paragraphs stays one bullet; clap drops a one-line help's
        // full stop, which the sentences after it need.
        let help = help.to_string().replace("\n\n", " ").replace('\n', " ");
        let stop = if help.ends_with('.') { "" } else { "." };
        sentences.push(format!("{help}{stop}"));
    }
    if arg.get_action().takes_values() {
        let values: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| match v.get_help() {
                Some(help) => format!("`{}` ({help})", v.get_name()),
                None => format!("`{}`", v.get_name()),
            })
            .collect();
        if !values.is_empty() {
            sentences.push(format!("One of: {}.", values.join(", ")));
        }
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| format!("`{}`", v.to_string_lossy()))
            .collect();
        if !defaults.is_empty() {
            sentences.push(format!("Default: {}.", defaults.join(", ")));
        }
    }
    if let Some(env) = arg.get_env() {
        sentences.push(format!("Environment: `{}`.", env.to_string_lossy()));
    }
    if arg.is_required_set() {
        sentences.push("Required.".to_string());
    }
    let mut line = format!("- {spelling}");
    if !sentences.is_empty() {
        write!(line, ": {}", sentences.join(" ")).unwrap();
    }
    writeln!(out, "{line}").unwrap();
}

fn value_names(arg: &clap::Arg) -> Vec<String> {
    let names: Vec<String> = match arg.get_value_names() {
        Some(names) => names.iter().map(|n| n.to_string()).collect(),
        None => vec![arg.get_id().as_str().to_uppercase()],
    };
    let repeated = matches!(arg.get_action(), clap::ArgAction::Append);
    names
        .into_iter()
        .map(|name| {
            let name = if arg.is_positional() && !arg.is_required_set() {
                format!("[{name}]")
            } else {
                format!("<{name}>")
            };
            if repeated && arg.is_positional() {
                format!("{name}...")
            } else {
                name
            }
        })
        .collect()
}

/// A page for one JSON Schema: a table of fields for each object in it, nested objects
/// under their own heading (`images.*.cache`, `images[].platforms[]`).
pub fn schema_page(title: &str, source: &str, intro: &str, schema: &Value) -> String {
    let mut out = generated_by(source);
    writeln!(out, "# {title}\n\n{intro}\n").unwrap();
    if let Some(description) = text(schema, "description") {
        writeln!(out, "{}\n", prose(description)).unwrap();
    }
    let mut walk = Walk {
        root: schema,
        sections: Vec::new(),
        homes: Vec::new(),
    };
    walk.collect("", schema);
    for (path, node) in &walk.sections {
        walk.section(&mut out, path, node);
    }
    one_final_newline(out)
}

fn one_final_newline(mut page: String) -> String {
    page.truncate(page.trim_end().len());
    page.push('\n');
    page
}

struct Walk<'a> {
    root: &'a Value,
    /// Every object with fields, by path, in page order.
    sections: Vec<(String, &'a Value)>,
    /// The path of each definition's first use: a list of builders and a builder share
    /// one section, and a field of that type links there.
    homes: Vec<(&'a str, String)>,
}

impl<'a> Walk<'a> {
    /// A section for an object with `properties`, then the objects nested in its fields.
    fn collect(&mut self, path: &str, node: &'a Value) {
        let Some(properties) = node.get("properties").and_then(Value::as_mapping) else {
            return;
        };
        self.sections.push((path.to_string(), node));
        for (name, field) in properties {
            let name = name.as_str().unwrap_or_default();
            let child = if path.is_empty() {
                name.to_string()
            } else {
                format!("{path}.{name}")
            };
            self.nested(&child, field);
        }
    }

    /// The objects inside a field: itself, a map's values (`.*`), a list's items (`[]`) and
    /// each alternative of a `oneOf`/`anyOf`.
    fn nested(&mut self, path: &str, node: &'a Value) {
        if let Some(name) = reference(node) {
            if self.homes.iter().any(|(home, _)| *home == name) {
                return;
            }
            self.homes.push((name, path.to_string()));
        }
        let node = self.resolve(node);
        self.collect(path, node);
        if let Some(values) = node.get("additionalProperties").filter(|v| v.is_mapping()) {
            self.nested(&format!("{path}.*"), values);
        }
        if let Some(items) = node.get("items") {
            self.nested(&format!("{path}[]"), items);
        }
        for key in ["oneOf", "anyOf"] {
            for alternative in node
                .get(key)
                .and_then(Value::as_sequence)
                .into_iter()
                .flatten()
            {
                self.nested(path, alternative);
            }
        }
    }

    /// A heading, the object's description and a table of its fields.
    fn section(&self, out: &mut String, path: &str, node: &'a Value) {
        let heading = if path.is_empty() {
            "Top level".to_string()
        } else {
            format!("`{path}`")
        };
        writeln!(out, "## {heading}\n").unwrap();
        if !path.is_empty() {
            if let Some(description) = text(node, "description") {
                writeln!(out, "{}\n", prose(description)).unwrap();
            }
        }
        let required: Vec<&str> = node
            .get("required")
            .and_then(Value::as_sequence)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        out.push_str(
            "| field | type | required | default | description |\n|---|---|---|---|---|\n",
        );
        let properties = node.get("properties").and_then(Value::as_mapping);
        for (name, field) in properties.into_iter().flatten() {
            let name = name.as_str().unwrap_or_default();
            // What the field says of itself wins over what its definition says.
            let definition = self.resolve(field);
            let mut description = text(field, "description")
                .or(text(definition, "description"))
                .unwrap_or_default()
                .to_string();
            if let Some(examples) = definition.get("examples").and_then(Value::as_sequence) {
                let examples: Vec<String> = examples
                    .iter()
                    .map(|e| format!("`{}`", shown_value(e)))
                    .collect();
                if !description.is_empty() && !description.ends_with('.') {
                    description.push('.');
                }
                write!(description, " Example: {}.", examples.join(", ")).unwrap();
            }
            writeln!(
                out,
                "| `{name}` | {} | {} | {} | {} |",
                cell(&self.type_of(field)),
                if required.contains(&name) { "yes" } else { "" },
                field
                    .get("default")
                    .or(definition.get("default"))
                    .map(|d| format!("`{}`", shown_value(d)))
                    .unwrap_or_default(),
                cell(description.trim())
            )
            .unwrap();
        }
        out.push('\n');
    }

    fn resolve(&self, node: &'a Value) -> &'a Value {
        match reference(node) {
            Some(name) => self
                .root
                .get("$defs")
                .and_then(|defs| defs.get(name))
                .unwrap_or_else(|| panic!("schema $ref to #/$defs/{name}, which is not there")),
            None => node,
        }
    }

    fn type_of(&self, node: &'a Value) -> String {
        if let Some(name) = reference(node) {
            let definition = self.resolve(node);
            let scalar = definition.get("enum").is_some()
                || (definition.get("properties").is_none() && definition.get("oneOf").is_none());
            return match name {
                "variable" => "`${VAR}`".to_string(),
                "platform" | "digest" => name.to_string(),
                // Objects and alternatives by their definition's name, as the schema
                // calls them (`image`, `builder`, `test`), linked to their section.
                _ if !scalar => match self.homes.iter().find(|(home, _)| *home == name) {
                    Some((_, path)) if self.sections.iter().any(|(p, _)| p == path) => {
                        format!("[{name}](#{})", super::markdown::anchor(path))
                    }
                    _ => name.to_string(),
                },
                _ => self.type_of(definition),
            };
        }
        if let Some(value) = node.get("const") {
            return format!("`{}`", shown_value(value));
        }
        if let Some(values) = node.get("enum").and_then(Value::as_sequence) {
            let values: Vec<String> = values
                .iter()
                .map(|v| format!("`{}`", shown_value(v)))
                .collect();
            return values.join(" or ");
        }
        match node.get("type") {
            Some(Value::String(kind)) if kind == "array" => {
                return match node.get("items") {
                    Some(items) => format!("list of {}", self.type_of(items)),
                    None => "list".to_string(),
                }
            }
            Some(Value::String(kind)) if kind == "object" && node.get("properties").is_none() => {
                return match node.get("additionalProperties").filter(|v| v.is_mapping()) {
                    Some(values) => format!("map of {}", self.type_of(values)),
                    None => "object".to_string(),
                }
            }
            // An `anyOf` beside a type only narrows it (a pattern, or a `${VAR}`).
            Some(Value::String(kind)) => return kind.clone(),
            Some(Value::Sequence(kinds)) => {
                return kinds
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(" or ")
            }
            _ => {}
        }
        for key in ["oneOf", "anyOf"] {
            if let Some(alternatives) = node.get(key).and_then(Value::as_sequence) {
                let mut kinds: Vec<String> = Vec::new();
                for alternative in alternatives {
                    let kind = self.type_of(alternative);
                    if !kind.is_empty() && !kinds.contains(&kind) {
                        kinds.push(kind);
                    }
                }
                // Any string may be a `${VAR}`; beside another type it is worth saying.
                if kinds.iter().any(|k| k == "string") {
                    kinds.retain(|k| k != "`${VAR}`");
                }
                return kinds.join(" or ");
            }
        }
        if node.get("properties").is_some() {
            "object".to_string()
        } else if node.get("pattern").is_some() {
            "string".to_string()
        } else {
            String::new()
        }
    }
}

/// `#/$defs/NAME` → NAME.
fn reference(node: &Value) -> Option<&str> {
    node.get("$ref")?.as_str()?.strip_prefix("#/$defs/")
}

fn text<'v>(node: &'v Value, key: &str) -> Option<&'v str> {
    node.get(key)?.as_str()
}

/// A schema value for a reader: a string as it is, anything else as JSON.
fn shown_value(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => json(other),
    }
}

/// A schema value as JSON, the way the file writes it.
fn json(value: &Value) -> String {
    let value: serde_json::Value = serde_json::to_value(value).expect("a schema value is JSON");
    serde_json::to_string(&value).expect("JSON serialises")
}

/// Text for a table cell: `|` escaped (in code spans too, as GitHub's tables need) and `<`
/// outside code spans, which markdown would take for an HTML tag (`sha256-<hex>`).
fn cell(text: &str) -> String {
    prose(text).replace('|', "\\|")
}

/// Schema text as markdown: `<` and `>` outside code spans escaped.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for ch in text.chars() {
        match ch {
            '`' => {
                in_code = !in_code;
                out.push(ch);
            }
            '<' if !in_code => out.push_str("&lt;"),
            '>' if !in_code => out.push_str("&gt;"),
            _ => out.push(ch),
        }
    }
    out
}
