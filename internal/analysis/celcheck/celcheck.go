// Package celcheck compiles device selectors in the DRA CEL environment and inspects their syntax
// tree against what this driver publishes, so that a typo in an attribute name or a comparison with
// the wrong type is caught on admission instead of silently never matching.
package celcheck

import (
	"crypto/sha256"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	apiservercel "k8s.io/apiserver/pkg/cel"
	"k8s.io/apiserver/pkg/cel/environment"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/lru"

	"github.com/gpu-dra/gpu-dra/internal/deviceschema"
)

// Checker analyzes selector expressions for one driver. It is safe for concurrent use; analyses
// are cached by the expression's SHA-256 because the same few selectors arrive over and over (a
// digest, not the expression: what the cache keeps must not grow with what a client sends).
type Checker struct {
	driver  string
	schema  deviceschema.Schema
	compile func(expr string) dracel.CompilationResult
	// cache holds analyses by sha256 of the expression (LRU, thread-safe).
	cache *lru.Cache
}

// New returns a Checker for the driver whose attribute domain is driver and whose devices publish schema.
func New(driver string, schema deviceschema.Schema) *Checker {
	c := &Checker{
		driver: driver,
		schema: schema,
		cache:  lru.New(4096),
	}
	// StoredExpressions accepts everything any supported server accepts; the server itself still
	// rejects what its own feature gates do not allow, so this never denies a valid selector.
	compiler := dracel.GetCompiler(dracel.Features{EnableConsumableCapacity: true, EnableListTypeAttributes: true})
	envType := environment.StoredExpressions
	c.compile = func(expr string) dracel.CompilationResult {
		return compiler.CompileCELExpression(expr, dracel.Options{EnvType: &envType})
	}
	return c
}

// Ref names one attribute or capacity a selector reads, fully qualified (domain/name).
type Ref struct {
	Capacity bool
	Domain   string
	Name     string
}

// Analysis is what a selector does. Issues are complete sentences ending with the fix.
type Analysis struct {
	// CompileError is set when the expression does not compile or is too expensive.
	CompileError string
	// Issues are references to attributes this driver never publishes and type mismatches.
	Issues []string
	// MentionsDriver: the expression compares device.driver with this driver's name.
	MentionsDriver bool
	// NamesDomain: the expression reads this driver's attribute or capacity domain.
	NamesDomain bool
	// Refs are the attributes and capacities the expression reads; with Opaque set they are
	// incomplete (the expression reads whole maps), so callers must assume it reads everything.
	Refs   []Ref
	Opaque bool
	// Comparisons are the references compared with a literal, so that a selector matching nothing
	// can be explained ("the selector wants model "X"; devices have ...").
	Comparisons []Comparison
}

// Comparison is `<ref> <op> <literal>` (in either order) in a selector.
type Comparison struct {
	Ref Ref
	// Op is the CEL operator as written: ==, !=, <, <=, >, >=.
	Op string
	// Literal is the literal's value: string, int64, uint64, float64 or bool.
	Literal any
}

// Analyze compiles and inspects one selector expression. The result is shared; do not modify it.
func (c *Checker) Analyze(expr string) *Analysis {
	// The API server's limit: a longer expression is never stored, so it is not worth compiling
	// (only a review sent to the webhook directly can carry one).
	if len(expr) > resourceapi.CELSelectorExpressionMaxLength {
		return &Analysis{CompileError: fmt.Sprintf("expression of %d bytes is longer than the %d bytes the API server accepts; shorten it", len(expr), resourceapi.CELSelectorExpressionMaxLength)}
	}
	key := sha256.Sum256([]byte(expr))
	if v, ok := c.cache.Get(key); ok {
		return v.(*Analysis)
	}
	a := c.analyze(expr)
	c.cache.Add(key, a)
	return a
}

func (c *Checker) analyze(expr string) *Analysis {
	res := c.compile(expr)
	if res.Error != nil {
		return &Analysis{CompileError: compileMessage(res.Error)}
	}
	// The API server's own limit: a selector it would store must not be refused here.
	if limit := uint64(resourceapi.CELSelectorExpressionMaxCost); res.MaxCost > limit {
		return &Analysis{CompileError: fmt.Sprintf("estimated cost %d exceeds the limit %d; simplify the expression (fewer nested loops and string operations)", res.MaxCost, limit)}
	}
	// The DRA compiler does not hand out its checked AST; compiling again in the same environment
	// is cheap next to the cached result and gives the type map the analysis needs.
	ast, iss := res.Environment.Compile(expr)
	if iss != nil && iss.Err() != nil {
		return &Analysis{CompileError: "compilation failed: " + iss.String()}
	}
	w := &walker{c: c, ast: ast.NativeRep(), an: &Analysis{}, aliases: map[string]domainRef{}, seen: map[string]bool{}}
	w.walk(w.ast.Expr())
	if w.refused != "" {
		return &Analysis{CompileError: w.refused}
	}
	return w.an
}

func compileMessage(err *apiservercel.Error) string {
	msg := strings.TrimSpace(err.Detail)
	// cel-go renders the position with a multi-line source excerpt; a warning or denial is one line.
	msg = strings.Join(strings.Fields(msg), " ")
	return msg + "; see https://kubernetes.io/docs/concepts/scheduling-eviction/dynamic-resource-allocation/ for the device variables (device.driver, device.attributes, device.capacity)"
}

// publishedAttributes lists the attribute names in documentation order.
func (c *Checker) publishedAttributes() string {
	names := make([]string, 0, len(c.schema.Attributes))
	for _, a := range c.schema.Attributes {
		names = append(names, string(a.Name))
	}
	return strings.Join(names, ", ")
}

func (c *Checker) publishedCapacities() string {
	names := make([]string, 0, len(c.schema.Capacities))
	for _, n := range c.schema.Capacities {
		names = append(names, string(n.Name))
	}
	return strings.Join(names, ", ")
}

// unknownRef returns the issue for a reference to this driver's domain that the schema lacks.
func (c *Checker) unknownRef(r Ref) string {
	name := resourceapi.QualifiedName(r.Name)
	if r.Capacity {
		if c.schema.HasCapacity(name) {
			return ""
		}
		msg := fmt.Sprintf("unknown capacity %q; this driver publishes %s", r.Name, c.publishedCapacities())
		if _, ok := c.schema.Attribute(name); ok {
			msg += fmt.Sprintf(" (%s is an attribute: device.attributes[%q].%s)", r.Name, c.driver, r.Name)
		}
		return msg
	}
	if _, ok := c.schema.Attribute(name); ok {
		return ""
	}
	msg := fmt.Sprintf("unknown attribute %q; this driver publishes %s", r.Name, c.publishedAttributes())
	if c.schema.HasCapacity(name) {
		msg += fmt.Sprintf(" (%s is a capacity: device.capacity[%q].%s)", r.Name, c.driver, r.Name)
	}
	return msg
}
