package celcheck

import (
	"fmt"
	"strings"

	celast "github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/types"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
)

const (
	deviceVar     = "device"
	attributesVar = "attributes"
	capacityVar   = "capacity"
	driverVar     = "driver"
)

// domainRef is `device.attributes["<domain>"]` or `device.capacity["<domain>"]`.
type domainRef struct {
	capacity bool
	domain   string
}

type walker struct {
	c   *Checker
	ast *celast.AST
	an  *Analysis
	// aliases are variables bound to a domain map, e.g. by cel.bind(gpu, device.attributes["d"], ...).
	aliases map[string]domainRef
	seen    map[string]bool
	// refused, when set, is why the expression must not run (see checkQuantity).
	refused string
}

func stringLiteral(e celast.Expr) (string, bool) {
	if e.Kind() != celast.LiteralKind {
		return "", false
	}
	s, ok := e.AsLiteral().(types.String)
	return string(s), ok
}

func (w *walker) isDevice(e celast.Expr) bool {
	if e.Kind() != celast.IdentKind || e.AsIdent() != deviceVar {
		return false
	}
	_, shadowed := w.aliases[deviceVar]
	return !shadowed
}

// deviceField matches device.<name>.
func (w *walker) deviceField(e celast.Expr, name string) bool {
	return e.Kind() == celast.SelectKind && e.AsSelect().FieldName() == name && !e.AsSelect().IsTestOnly() && w.isDevice(e.AsSelect().Operand())
}

func isIndex(fn string) bool { return fn == "_[_]" || fn == "_[?_]" }

// domainOf recognizes a domain map: device.attributes["d"], device.capacity["d"], or an alias.
func (w *walker) domainOf(e celast.Expr) (domainRef, bool) {
	switch e.Kind() {
	case celast.IdentKind:
		d, ok := w.aliases[e.AsIdent()]
		return d, ok
	case celast.CallKind:
		call := e.AsCall()
		if !isIndex(call.FunctionName()) || len(call.Args()) != 2 {
			return domainRef{}, false
		}
		dom, ok := stringLiteral(call.Args()[1])
		if !ok {
			return domainRef{}, false
		}
		switch {
		case w.deviceField(call.Args()[0], attributesVar):
			return domainRef{domain: dom}, true
		case w.deviceField(call.Args()[0], capacityVar):
			return domainRef{capacity: true, domain: dom}, true
		}
	}
	return domainRef{}, false
}

// refOf recognizes one attribute or capacity: <domain map>.name or <domain map>["name"].
func (w *walker) refOf(e celast.Expr) (Ref, bool) {
	switch e.Kind() {
	case celast.SelectKind:
		sel := e.AsSelect()
		if d, ok := w.domainOf(sel.Operand()); ok {
			return Ref{Capacity: d.capacity, Domain: d.domain, Name: sel.FieldName()}, true
		}
	case celast.CallKind:
		call := e.AsCall()
		if isIndex(call.FunctionName()) && len(call.Args()) == 2 {
			if d, ok := w.domainOf(call.Args()[0]); ok {
				if name, ok := stringLiteral(call.Args()[1]); ok {
					return Ref{Capacity: d.capacity, Domain: d.domain, Name: name}, true
				}
			}
		}
	}
	return Ref{}, false
}

func (w *walker) record(r Ref) {
	key := fmt.Sprintf("%t/%s/%s", r.Capacity, r.Domain, r.Name)
	if w.seen[key] {
		return
	}
	w.seen[key] = true
	w.an.Refs = append(w.an.Refs, r)
	if r.Domain != w.c.driver {
		return
	}
	w.an.NamesDomain = true
	if msg := w.c.unknownRef(r); msg != "" {
		w.an.Issues = append(w.an.Issues, msg)
	}
}

func (w *walker) walk(e celast.Expr) {
	if r, ok := w.refOf(e); ok {
		w.record(r)
		return
	}
	if d, ok := w.domainOf(e); ok {
		// A whole domain map escapes (passed to a function, iterated, indexed dynamically):
		// which attributes it reads is unknown.
		if d.domain == w.c.driver {
			w.an.NamesDomain = true
		}
		w.an.Opaque = true
		return
	}
	switch e.Kind() {
	case celast.IdentKind:
		if w.isDevice(e) {
			w.an.Opaque = true
		}
	case celast.SelectKind:
		sel := e.AsSelect()
		if w.deviceField(e, attributesVar) || w.deviceField(e, capacityVar) {
			w.an.Opaque = true
			return
		}
		if w.deviceField(e, driverVar) {
			return
		}
		w.walk(sel.Operand())
	case celast.CallKind:
		w.walkCall(e)
	case celast.ComprehensionKind:
		w.walkComprehension(e.AsComprehension())
	case celast.ListKind:
		for _, el := range e.AsList().Elements() {
			w.walk(el)
		}
	case celast.MapKind:
		for _, en := range e.AsMap().Entries() {
			me := en.AsMapEntry()
			w.walk(me.Key())
			w.walk(me.Value())
		}
	case celast.StructKind:
		for _, en := range e.AsStruct().Fields() {
			w.walk(en.AsStructField().Value())
		}
	}
}

func (w *walker) walkComprehension(comp celast.ComprehensionExpr) {
	// cel.bind(v, init, body) expands to a comprehension over an empty list whose accumulator is
	// init: keep following attribute reads through the alias.
	if d, ok := w.domainOf(comp.AccuInit()); ok {
		if d.domain == w.c.driver {
			w.an.NamesDomain = true
		}
		saved, had := w.aliases[comp.AccuVar()]
		w.aliases[comp.AccuVar()] = d
		// The loop of a bind is empty (its step only returns the accumulator); the body is the result.
		w.walk(comp.Result())
		if had {
			w.aliases[comp.AccuVar()] = saved
		} else {
			delete(w.aliases, comp.AccuVar())
		}
		return
	}
	// Loop variables shadow aliases of the same name.
	shadow := []string{comp.IterVar(), comp.AccuVar()}
	if comp.HasIterVar2() {
		shadow = append(shadow, comp.IterVar2())
	}
	saved := map[string]domainRef{}
	for _, v := range shadow {
		if d, ok := w.aliases[v]; ok {
			saved[v] = d
			delete(w.aliases, v)
		}
	}
	w.walk(comp.IterRange())
	w.walk(comp.AccuInit())
	w.walk(comp.LoopCondition())
	w.walk(comp.LoopStep())
	w.walk(comp.Result())
	for v, d := range saved {
		w.aliases[v] = d
	}
}

var comparisons = map[string]bool{"_==_": true, "_!=_": true, "_<_": true, "_<=_": true, "_>_": true, "_>=_": true}

// Receiver functions that only make sense on one attribute type.
var (
	versionMethods = map[string]bool{"isGreaterThan": true, "isLessThan": true, "compareTo": true, "major": true, "minor": true, "patch": true}
	stringMethods  = map[string]bool{"startsWith": true, "endsWith": true, "contains": true, "matches": true, "lowerAscii": true, "upperAscii": true,
		"trim": true, "split": true, "indexOf": true, "lastIndexOf": true, "substring": true, "replace": true, "charAt": true}
)

func (w *walker) walkCall(e celast.Expr) {
	call := e.AsCall()
	fn := call.FunctionName()
	args := call.Args()
	w.checkQuantity(call)
	switch {
	case fn == "@in" && len(args) == 2:
		// "name" in device.attributes["d"] tests presence of one attribute.
		if d, ok := w.domainOf(args[1]); ok {
			if name, ok := stringLiteral(args[0]); ok {
				w.record(Ref{Capacity: d.capacity, Domain: d.domain, Name: name})
				return
			}
		}
		if w.deviceField(args[0], driverVar) && args[1].Kind() == celast.ListKind {
			for _, el := range args[1].AsList().Elements() {
				if s, ok := stringLiteral(el); ok && s == w.c.driver {
					w.an.MentionsDriver = true
				}
			}
		}
	case comparisons[fn] && len(args) == 2:
		for i := range 2 {
			if w.deviceField(args[i], driverVar) {
				if s, ok := stringLiteral(args[1-i]); ok && s == w.c.driver && (fn == "_==_") {
					w.an.MentionsDriver = true
				}
			}
			if r, ok := w.refOf(args[i]); ok {
				w.checkComparison(r, args[i], args[1-i])
				w.recordComparison(r, fn, i == 1, args[1-i])
			}
		}
	case call.IsMemberFunction():
		if r, ok := w.refOf(call.Target()); ok {
			w.checkMethod(r, fn, call.Target())
		}
	}
	if call.IsMemberFunction() {
		w.walk(call.Target())
	}
	for _, a := range args {
		w.walk(a)
	}
}

// recordComparison notes a comparison of r with a literal; swapped says the literal came first
// (`"X" == ref`), so the operator is turned around to read ref-first.
func (w *walker) recordComparison(r Ref, fn string, swapped bool, other celast.Expr) {
	if other.Kind() != celast.LiteralKind {
		return
	}
	var lit any
	switch v := other.AsLiteral().(type) {
	case types.String:
		lit = string(v)
	case types.Int:
		lit = int64(v)
	case types.Uint:
		lit = uint64(v)
	case types.Double:
		lit = float64(v)
	case types.Bool:
		lit = bool(v)
	default:
		return
	}
	op := strings.Trim(fn, "_")
	if swapped {
		op = map[string]string{"<": ">", "<=": ">=", ">": "<", ">=": "<="}[op]
		if op == "" {
			op = strings.Trim(fn, "_")
		}
	}
	w.an.Comparisons = append(w.an.Comparisons, Comparison{Ref: r, Op: op, Literal: lit})
}

// attrSpec returns the schema entry of one of this driver's attributes.
func (w *walker) attrSpec(r Ref) (deviceschema.AttributeSpec, bool) {
	if r.Capacity || r.Domain != w.c.driver {
		return deviceschema.AttributeSpec{}, false
	}
	return w.c.schema.Attribute(resourceapi.QualifiedName(r.Name))
}

func (w *walker) checkComparison(r Ref, self, other celast.Expr) {
	spec, ok := w.attrSpec(r)
	if !ok {
		return
	}
	if _, isRef := w.refOf(other); isRef {
		return
	}
	t := w.ast.GetType(other.ID())
	got, known := typeName(t)
	if !known || accepts(spec.Type, t) {
		return
	}
	w.an.Issues = append(w.an.Issues, fmt.Sprintf("attribute %q is %s but is compared with %s; compare it with %s",
		r.Name, article(spec.Type), got, example(w.c.driver, spec)))
}

func (w *walker) checkMethod(r Ref, fn string, target celast.Expr) {
	spec, ok := w.attrSpec(r)
	if !ok {
		return
	}
	switch {
	case versionMethods[fn] && spec.Type != deviceschema.VersionType:
		w.an.Issues = append(w.an.Issues, fmt.Sprintf("attribute %q is %s, but %s() works on versions only; compare it with %s",
			r.Name, article(spec.Type), fn, example(w.c.driver, spec)))
	case stringMethods[fn] && spec.Type != deviceschema.StringType:
		w.an.Issues = append(w.an.Issues, fmt.Sprintf("attribute %q is %s, but %s() works on strings only; compare it with %s",
			r.Name, article(spec.Type), fn, example(w.c.driver, spec)))
	}
}

// typeName describes a checked CEL type; unknown means dynamic, so no verdict is possible.
func typeName(t *types.Type) (string, bool) {
	if t == nil {
		return "", false
	}
	switch t.Kind() {
	case types.IntKind:
		return "an int", true
	case types.UintKind:
		return "a uint", true
	case types.DoubleKind:
		return "a double", true
	case types.StringKind:
		return "a string", true
	case types.BoolKind:
		return "a bool", true
	case types.BytesKind:
		return "bytes", true
	case types.NullTypeKind:
		return "null", true
	case types.ListKind:
		return "a list", true
	case types.MapKind:
		return "a map", true
	case types.OpaqueKind, types.StructKind:
		switch t.TypeName() {
		case "kubernetes.Semver":
			return "a version (semver)", true
		case "kubernetes.Quantity":
			return "a quantity", true
		}
		return t.TypeName(), true
	}
	return "", false
}

func accepts(want deviceschema.AttributeType, t *types.Type) bool {
	switch want {
	case deviceschema.IntType:
		return t.Kind() == types.IntKind || t.Kind() == types.UintKind || t.Kind() == types.DoubleKind
	case deviceschema.StringType:
		return t.Kind() == types.StringKind
	case deviceschema.BoolType:
		return t.Kind() == types.BoolKind
	case deviceschema.VersionType:
		return t.TypeName() == "kubernetes.Semver"
	}
	return true
}

func article(t deviceschema.AttributeType) string {
	switch t {
	case deviceschema.IntType:
		return "an int"
	case deviceschema.StringType:
		return "a string"
	case deviceschema.BoolType:
		return "a bool"
	case deviceschema.VersionType:
		return "a version"
	}
	return string(t)
}

func example(driver string, spec deviceschema.AttributeSpec) string {
	lhs := fmt.Sprintf("device.attributes[%q].%s", driver, spec.Name)
	switch spec.Type {
	case deviceschema.IntType:
		return fmt.Sprintf("an int, e.g. %s == 0", lhs)
	case deviceschema.StringType:
		return fmt.Sprintf("a quoted string, e.g. %s == \"%s\"", lhs, deviceschema.DefaultModel)
	case deviceschema.BoolType:
		return fmt.Sprintf("true or false, e.g. %s == true", lhs)
	case deviceschema.VersionType:
		return fmt.Sprintf("semver(), e.g. %s == semver(\"%s\") or %s.isGreaterThan(semver(\"%s\"))", lhs, deviceschema.DefaultDriverVersion, lhs, deviceschema.DefaultDriverVersion)
	}
	return "a value of type " + string(spec.Type)
}
