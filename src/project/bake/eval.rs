//! Expressions evaluated as hcl-rs does, except bake's `try(expr, fallback…)` and
//! `can(expr)` (hashicorp/hcl's tryfunc): their arguments are expressions, evaluated
//! one by one, an error making `try` go on to the next and `can` answer false.
//!
//! hcl-rs evaluates every argument before it calls a function, so the nodes on the way
//! to a `try` or `can` are evaluated here, each child that holds one replaced by its
//! value, and the rest is left to hcl-rs: an expression without them is hcl-rs's alone.
//!
//! The file is resolved in rounds (a name not resolved yet fails, and is tried again in
//! the next round), which a `try` would hide by falling back: a `try` naming a variable
//! or a `target.NAME.FIELD` still [`Waiting`] fails as the name itself would.

use super::functions;
use hcl::eval::{Context, Error, ErrorKind, Evaluate};
use hcl::expr::{
    BinaryOp, ForExpr, FuncCall, Object, ObjectKey, Operation, Traversal, TraversalOperator,
    UnaryOp,
};
use hcl::template::{Directive, Element, Template};
use hcl::{Expression, Value};
use std::cell::RefCell;
use std::ops::ControlFlow;

type Result<T> = std::result::Result<T, Error>;

/// The names the file has yet to resolve in this round.
#[derive(Default)]
pub(super) struct Waiting {
    pub(super) variables: Vec<String>,
    /// `(target, field)` pairs.
    pub(super) fields: Vec<(String, String)>,
}

thread_local! {
    static WAITING: RefCell<Waiting> = const {
        RefCell::new(Waiting { variables: Vec::new(), fields: Vec::new() })
    };
}

/// What a `try` or `can` must wait for before it may fall back (see the module's doc).
pub(super) fn set_waiting(waiting: Waiting) {
    WAITING.with(|w| *w.borrow_mut() = waiting);
}

/// `expression`'s value in `context`.
pub(super) fn evaluate(expression: &Expression, context: &Context) -> Result<Value> {
    if !mentions_try(expression) {
        return expression.evaluate(context);
    }
    let value = |e: &Expression| evaluate(e, context).map(Expression::from);
    match expression {
        Expression::FuncCall(call) if is(call, "try") => call_try(call, context),
        Expression::FuncCall(call) if is(call, "can") => call_can(call, context),
        Expression::FuncCall(call) => FuncCall {
            name: call.name.clone(),
            args: call.args.iter().map(value).collect::<Result<_>>()?,
            expand_final: call.expand_final,
        }
        .evaluate(context),
        Expression::Array(items) => Ok(Value::Array(
            items
                .iter()
                .map(|e| evaluate(e, context))
                .collect::<Result<_>>()?,
        )),
        Expression::Object(entries) => {
            let mut out = hcl::Map::new();
            for (key, e) in entries {
                let key = match key {
                    ObjectKey::Expression(k) => object_key(evaluate(k, context)?)?,
                    identifier => identifier.to_string(),
                };
                out.insert(key, evaluate(e, context)?);
            }
            Ok(Value::Object(out))
        }
        Expression::Parenthesis(inner) => evaluate(inner, context),
        Expression::Conditional(c) => match evaluate(&c.cond_expr, context)? {
            Value::Bool(true) => evaluate(&c.true_expr, context),
            Value::Bool(false) => evaluate(&c.false_expr, context),
            other => Err(ErrorKind::Unexpected(other, "a boolean").into()),
        },
        Expression::Operation(operation) => Expression::from(match &**operation {
            Operation::Unary(op) => Operation::Unary(UnaryOp {
                operator: op.operator,
                expr: value(&op.expr)?,
            }),
            Operation::Binary(op) => Operation::Binary(BinaryOp {
                lhs_expr: value(&op.lhs_expr)?,
                operator: op.operator,
                rhs_expr: value(&op.rhs_expr)?,
            }),
        })
        .evaluate(context),
        Expression::Traversal(traversal) => Traversal {
            expr: value(&traversal.expr)?,
            operators: traversal
                .operators
                .iter()
                .map(|operator| match operator {
                    TraversalOperator::Index(e) => value(e).map(TraversalOperator::Index),
                    other => Ok(other.clone()),
                })
                .collect::<Result<_>>()?,
        }
        .evaluate(context),
        Expression::ForExpr(each) => evaluate_for(each, context),
        Expression::TemplateExpr(text) => {
            let template = Template::from_expr(text)?;
            // A template of one interpolation is that value, not its text (HCL's unwrapping).
            if let [Element::Interpolation(only)] = template.elements() {
                return evaluate(&only.expr, context);
            }
            let mut elements = Vec::new();
            for element in template.elements() {
                elements.push(match element {
                    Element::Interpolation(i) if mentions_try(&i.expr) => {
                        let mut i = i.clone();
                        i.expr = value(&i.expr)?;
                        Element::Interpolation(i)
                    }
                    Element::Directive(d) if directive_mentions_try(d) => {
                        return Err(ErrorKind::Message(
                            "try() and can() inside a %{…} directive are not supported; \
                             compute the value in a variable and interpolate it"
                                .into(),
                        )
                        .into())
                    }
                    other => other.clone(),
                });
            }
            elements
                .into_iter()
                .collect::<Template>()
                .evaluate(context)
                .map(Value::String)
        }
        other => other.evaluate(context),
    }
}

fn is(call: &FuncCall, name: &str) -> bool {
    call.name.namespace.is_empty() && call.name.name.as_str() == name
}

/// `try(a, b, …)`: the first argument that evaluates, as bake's tryfunc.
fn call_try(call: &FuncCall, context: &Context) -> Result<Value> {
    let refused = |why: String| Error::from(ErrorKind::FuncCall(call.name.clone(), why));
    if call.args.is_empty() {
        return Err(refused("at least one argument is required".into()));
    }
    if call.expand_final {
        return Err(refused(
            "takes expressions, not an expanded list (…)".into(),
        ));
    }
    wait_for(&call.args, context)?;
    let mut why = Vec::new();
    for (n, arg) in call.args.iter().enumerate() {
        match evaluate(arg, context) {
            Ok(value) => return Ok(value),
            Err(e) => why.push(format!("{}: {e}", n + 1)),
        }
    }
    Err(refused(format!(
        "no expression succeeded ({})",
        why.join("; ")
    )))
}

/// `can(expr)`: whether the argument evaluates.
fn call_can(call: &FuncCall, context: &Context) -> Result<Value> {
    match call.args.as_slice() {
        [arg] if !call.expand_final => {
            wait_for(std::slice::from_ref(arg), context)?;
            Ok(Value::Bool(evaluate(arg, context).is_ok()))
        }
        _ => Err(ErrorKind::FuncCall(call.name.clone(), "takes one expression".into()).into()),
    }
}

/// `[for k, v in collection : value if cond]` and `{for … : key => value…}`, as hcl-rs
/// evaluates them, each element's expressions through [`evaluate`].
fn evaluate_for(each: &ForExpr, context: &Context) -> Result<Value> {
    let items: Vec<(Value, Value)> = match evaluate(&each.collection_expr, context)? {
        Value::Array(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, v)| (Value::from(i), v))
            .collect(),
        Value::Object(entries) => entries
            .into_iter()
            .map(|(k, v)| (Value::from(k), v))
            .collect(),
        other => return Err(ErrorKind::Unexpected(other, "an array or object").into()),
    };
    let mut list = Vec::new();
    let mut object = hcl::Map::new();
    for (key, value) in items {
        let mut scope = context.clone();
        if let Some(name) = &each.key_var {
            scope.declare_var(name.clone(), key);
        }
        scope.declare_var(each.value_var.clone(), value);
        if let Some(cond) = &each.cond_expr {
            match evaluate(cond, &scope)? {
                Value::Bool(true) => {}
                Value::Bool(false) => continue,
                other => return Err(ErrorKind::Unexpected(other, "a boolean").into()),
            }
        }
        let value = evaluate(&each.value_expr, &scope)?;
        let Some(key_expr) = &each.key_expr else {
            list.push(value);
            continue;
        };
        let key = object_key(evaluate(key_expr, &scope)?)?;
        if each.grouping {
            if let Value::Array(group) = object
                .entry(key)
                .or_insert_with(|| Value::Array(Vec::new()))
            {
                group.push(value);
            }
        } else if object.contains_key(&key) {
            return Err(ErrorKind::KeyExists(key).into());
        } else {
            object.insert(key, value);
        }
    }
    Ok(match each.key_expr {
        Some(_) => Value::Object(object),
        None => Value::Array(list),
    })
}

/// An object key's value as its text, as hcl-rs (and Go's HCL) allow.
fn object_key(value: Value) -> Result<String> {
    match value {
        Value::String(s) => Ok(s),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Number(n) => Ok(n.to_string()),
        other => Err(ErrorKind::Unexpected(other, "a string, boolean or number").into()),
    }
}

/// Every expression within `expression` (itself first, template interpolations and
/// directives included), with the names bound around it by `for`.
fn each_within<T>(
    expression: &Expression,
    bound: &mut Vec<String>,
    f: &mut impl FnMut(&Expression, &[String]) -> ControlFlow<T>,
) -> ControlFlow<T> {
    f(expression, bound)?;
    match expression {
        Expression::Array(items) => {
            for e in items {
                each_within(e, bound, f)?;
            }
        }
        Expression::Object(entries) => each_entry(entries, bound, f)?,
        Expression::TemplateExpr(text) => {
            // A template that does not parse is hcl-rs's to report when it evaluates it.
            if let Ok(template) = Template::from_expr(text) {
                each_in_template(&template, bound, f)?;
            }
        }
        Expression::Traversal(traversal) => {
            each_within(&traversal.expr, bound, f)?;
            for operator in &traversal.operators {
                if let TraversalOperator::Index(e) = operator {
                    each_within(e, bound, f)?;
                }
            }
        }
        Expression::FuncCall(call) => {
            for e in &call.args {
                each_within(e, bound, f)?;
            }
        }
        Expression::Parenthesis(inner) => each_within(inner, bound, f)?,
        Expression::Conditional(c) => {
            for e in [&c.cond_expr, &c.true_expr, &c.false_expr] {
                each_within(e, bound, f)?;
            }
        }
        Expression::Operation(operation) => match &**operation {
            Operation::Unary(op) => each_within(&op.expr, bound, f)?,
            Operation::Binary(op) => {
                each_within(&op.lhs_expr, bound, f)?;
                each_within(&op.rhs_expr, bound, f)?;
            }
        },
        Expression::ForExpr(each) => {
            each_within(&each.collection_expr, bound, f)?;
            let before = bound.len();
            bound.extend(each.key_var.iter().map(|k| k.to_string()));
            bound.push(each.value_var.to_string());
            let inner = each.key_expr.iter().chain([&each.value_expr]);
            for e in inner.chain(each.cond_expr.iter()) {
                each_within(e, bound, f)?;
            }
            bound.truncate(before);
        }
        _ => {}
    }
    ControlFlow::Continue(())
}

fn each_entry<T>(
    entries: &Object<ObjectKey, Expression>,
    bound: &mut Vec<String>,
    f: &mut impl FnMut(&Expression, &[String]) -> ControlFlow<T>,
) -> ControlFlow<T> {
    for (key, e) in entries {
        if let ObjectKey::Expression(k) = key {
            each_within(k, bound, f)?;
        }
        each_within(e, bound, f)?;
    }
    ControlFlow::Continue(())
}

fn each_in_template<T>(
    template: &Template,
    bound: &mut Vec<String>,
    f: &mut impl FnMut(&Expression, &[String]) -> ControlFlow<T>,
) -> ControlFlow<T> {
    for element in template.elements() {
        match element {
            Element::Literal(_) => {}
            Element::Interpolation(i) => each_within(&i.expr, bound, f)?,
            Element::Directive(d) => each_in_directive(d, bound, f)?,
        }
    }
    ControlFlow::Continue(())
}

fn each_in_directive<T>(
    directive: &Directive,
    bound: &mut Vec<String>,
    f: &mut impl FnMut(&Expression, &[String]) -> ControlFlow<T>,
) -> ControlFlow<T> {
    match directive {
        Directive::If(d) => {
            each_within(&d.cond_expr, bound, f)?;
            each_in_template(&d.true_template, bound, f)?;
            if let Some(other) = &d.false_template {
                each_in_template(other, bound, f)?;
            }
        }
        Directive::For(d) => {
            each_within(&d.collection_expr, bound, f)?;
            let before = bound.len();
            bound.extend(d.key_var.iter().map(|k| k.to_string()));
            bound.push(d.value_var.to_string());
            each_in_template(&d.template, bound, f)?;
            bound.truncate(before);
        }
    }
    ControlFlow::Continue(())
}

fn is_try_or_can(e: &Expression, _: &[String]) -> ControlFlow<()> {
    match e {
        Expression::FuncCall(call) if is(call, "try") || is(call, "can") => ControlFlow::Break(()),
        _ => ControlFlow::Continue(()),
    }
}

fn mentions_try(expression: &Expression) -> bool {
    each_within(expression, &mut Vec::new(), &mut is_try_or_can).is_break()
}

fn directive_mentions_try(directive: &Directive) -> bool {
    each_in_directive(directive, &mut Vec::new(), &mut is_try_or_can).is_break()
}

/// The error a name of `args` still waiting gives (what it gives unresolved), if any: the
/// names the file's functions they call read count too. A name `context` holds (a `for`'s,
/// a function's parameter, a variable resolved earlier in this round) waits for nothing.
fn wait_for(args: &[Expression], context: &Context) -> Result<()> {
    WAITING.with(|waiting| {
        let waiting = waiting.borrow();
        if waiting.variables.is_empty() && waiting.fields.is_empty() {
            return Ok(());
        }
        let mut seen = Vec::new();
        for arg in args {
            let mut bound = Vec::new();
            if let ControlFlow::Break(e) = waits(arg, &mut bound, &waiting, &mut seen, context) {
                return Err(e);
            }
        }
        Ok(())
    })
}

fn waits(
    expression: &Expression,
    bound: &mut Vec<String>,
    waiting: &Waiting,
    seen: &mut Vec<String>,
    context: &Context,
) -> ControlFlow<Error> {
    each_within(expression, bound, &mut |e, bound| {
        let free = |name: &str| !bound.iter().any(|b| b == name);
        match e {
            Expression::Variable(v)
                if free(v)
                    && waiting.variables.iter().any(|w| w == v.as_str())
                    && e.evaluate(context).is_err() =>
            {
                ControlFlow::Break(ErrorKind::UndefinedVar(v.clone().into_inner()).into())
            }
            Expression::Traversal(t) => match (&t.expr, t.operators.as_slice()) {
                (Expression::Variable(root), [TraversalOperator::GetAttr(name), rest @ ..])
                    if root.as_str() == "target" && free("target") =>
                {
                    let field = match rest.first() {
                        Some(TraversalOperator::GetAttr(field)) => Some(field.as_str()),
                        _ => None,
                    };
                    match waiting
                        .fields
                        .iter()
                        .find(|(t, f)| t == name.as_str() && field.is_none_or(|field| f == field))
                    {
                        Some((_, f)) => ControlFlow::Break(ErrorKind::NoSuchKey(f.clone()).into()),
                        None => ControlFlow::Continue(()),
                    }
                }
                _ => ControlFlow::Continue(()),
            },
            Expression::FuncCall(call) => {
                let name = call.name.name.to_string();
                if seen.contains(&name) {
                    return ControlFlow::Continue(());
                }
                seen.push(name.clone());
                match functions::user(&name) {
                    Some(function) => {
                        let mut params = function.params.clone();
                        params.extend(function.variadic.clone());
                        waits(&function.result, &mut params, waiting, seen, context)
                    }
                    None => ControlFlow::Continue(()),
                }
            }
            _ => ControlFlow::Continue(()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::project::bake::functions::UserFunction;

    /// `expression` evaluated with the standard library, `M = { key = "v" }`, `TAG =
    /// "v1.2"`, and the file's `functions`.
    fn eval_with(expression: &str, functions: &[UserFunction]) -> Result<Value> {
        let mut context = functions::context(functions).unwrap();
        context.declare_var("M", Value::Object([("key".into(), "v".into())].into()));
        context.declare_var("TAG", "v1.2");
        functions::set_scope(&context);
        let e: Expression = expression.parse().unwrap();
        evaluate(&e, &context)
    }

    fn eval(expression: &str) -> Result<Value> {
        eval_with(expression, &[])
    }

    fn json(expression: &str) -> String {
        let value = eval(expression).unwrap_or_else(|e| panic!("{expression}: {e}"));
        serde_json::to_string(&value).unwrap()
    }

    #[test]
    fn try_gives_its_first_argument_that_evaluates() {
        let cases = [
            (r#"try(M.key, "d")"#, r#""v""#),
            (r#"try(M.nope, "d")"#, r#""d""#),
            (r#"try(M["nope"], NOPE, 3)"#, "3"),
            (r#"try(null, "d")"#, "null"),
            (r#"try(try(M.a, M.b), try(M.c, "inner"))"#, r#""inner""#),
            (r#"upper(try(M.nope, "d"))"#, r#""D""#),
            (r#"try(regex("^v([0-9]+)", TAG)[0], "dev")"#, r#""1""#),
            (
                r#"[for k in ["key", "x"] : try(M[k], "-")]"#,
                r#"["v","-"]"#,
            ),
            (
                r#"{for k in ["key", "x"] : k => try(M[k], "-") if k != "y"}"#,
                r#"{"key":"v","x":"-"}"#,
            ),
            (
                r#"{for k in ["a", "b"] : "g" => try(k, 0)...}"#,
                r#"{"g":["a","b"]}"#,
            ),
            (r#""tag-${try(M.nope, "q")}-${TAG}""#, r#""tag-q-v1.2""#),
            (r#""${try(M.nope, ["x"])}""#, r#"["x"]"#),
            (r#"true ? try(M.key, 1) : NOPE"#, r#""v""#),
            (
                r#"{ (try(M.key, "k")) = try(M.nope, 1) + 1 }"#,
                r#"{"v":2}"#,
            ),
            (r#"["a", "b"][try(M.nope, 1)]"#, r#""b""#),
        ];
        for (expression, want) in cases {
            assert_eq!(json(expression), want, "{expression}");
        }
    }

    #[test]
    fn can_tells_whether_its_argument_evaluates() {
        assert_eq!(json(r#"can(regex("^v[0-9]", TAG))"#), "true");
        assert_eq!(json(r#"can(regex("^w[0-9]", TAG))"#), "false");
        assert_eq!(json("can(NOPE)"), "false");
        assert_eq!(json("[for x in [1, M] : can(x.key)]"), "[false,true]");
    }

    #[test]
    fn a_try_whose_every_argument_fails_says_why() {
        let e = eval("try(M.nope, NOPE)").unwrap_err();
        let ErrorKind::FuncCall(name, why) = e.kind() else {
            panic!("{e}")
        };
        assert_eq!(name.name.as_str(), "try");
        assert!(why.starts_with("no expression succeeded (1: "), "{why}");
        assert!(matches!(
            eval("try()").unwrap_err().kind(),
            ErrorKind::FuncCall(..)
        ));
        assert!(matches!(
            eval("can(1, 2)").unwrap_err().kind(),
            ErrorKind::FuncCall(..)
        ));
        // A try inside a %{…} directive is refused, not guessed.
        assert!(matches!(
            eval(r#""%{ for x in ["a"] }${try(x, "")}%{ endfor }""#)
                .unwrap_err()
                .kind(),
            ErrorKind::Message(_)
        ));
    }

    #[test]
    fn a_try_naming_a_name_not_resolved_yet_fails_as_the_name_would() {
        let function = UserFunction {
            name: "later".into(),
            params: vec!["p".into()],
            variadic: None,
            result: "try(LATER, p)".parse().unwrap(),
        };
        set_waiting(Waiting {
            variables: vec!["LATER".into(), "p".into()],
            fields: vec![("app".into(), "tags".into())],
        });
        let waited = |expression: &str| eval_with(expression, std::slice::from_ref(&function));
        assert!(matches!(
            waited(r#"try(LATER, "d")"#).unwrap_err().kind(),
            ErrorKind::UndefinedVar(name) if name.as_str() == "LATER"
        ));
        assert!(matches!(
            waited(r#"can(target.app.tags)"#).unwrap_err().kind(),
            ErrorKind::NoSuchKey(key) if key == "tags"
        ));
        assert!(waited(r#"try(target.app, {})"#).is_err());
        assert!(waited(r#"try(later(1), "d")"#).is_err());
        // Another field, a name a `for` or a function parameter binds: no wait.
        assert!(waited(r#"try(target.app.args, "d")"#).is_ok());
        assert!(waited(r#"[for LATER in [1] : try(LATER, 0)]"#).is_ok());
        set_waiting(Waiting {
            variables: vec!["p".into()],
            fields: Vec::new(),
        });
        assert_eq!(waited("later(7)").unwrap(), Value::from(7));
        set_waiting(Waiting::default());
    }
}
