package idemvet

import (
	"go/ast"
	"go/token"
	"go/types"
	"regexp"
	"strings"

	"golang.org/x/tools/go/ast/inspector"
	"golang.org/x/tools/go/types/typeutil"
)

// This file traces where a value comes from: the assignments of local
// variables, and the calls that return a new value every time.

var (
	stripeRoot = regexp.MustCompile(`^github\.com/stripe/stripe-go(/v[0-9]+)?$`)
	stripeAny  = regexp.MustCompile(`^github\.com/stripe/stripe-go(/v[0-9]+)?(/.*)?$`)
)

type defKind int

const (
	defAssign  defKind = iota // v = rhs, v := rhs, var v = rhs
	defCounter                // v++, v += n
	defRange                  // for k, v := range x
	defZero                   // var v T: the zero value, then filled in by code not traced
)

type def struct {
	pos  token.Pos
	rhs  ast.Expr
	kind defKind
	loop ast.Node // for defRange: the range statement
}

func (c *checker) localVar(id *ast.Ident) *types.Var {
	v, ok := c.pass.TypesInfo.ObjectOf(id).(*types.Var)
	if !ok || v.IsField() || v.Pkg() == nil || v.Parent() == v.Pkg().Scope() {
		return nil
	}
	return v
}

func (c *checker) addDef(lhs ast.Expr, d def) {
	id, ok := ast.Unparen(lhs).(*ast.Ident)
	if !ok {
		return
	}
	if v := c.localVar(id); v != nil {
		c.defs[v] = append(c.defs[v], d)
	}
}

func (c *checker) addParams(owner ast.Node, recv *ast.FieldList, ft *ast.FuncType) {
	for _, fl := range []*ast.FieldList{recv, ft.Params} {
		if fl == nil {
			continue
		}
		for _, f := range fl.List {
			for _, name := range f.Names {
				if v, ok := c.pass.TypesInfo.Defs[name].(*types.Var); ok {
					c.params[v] = owner
				}
			}
		}
	}
}

// collectDefs records the parameters of the function declared at fdc and
// of its function literals, and every assignment of its local variables.
func (c *checker) collectDefs(fdc inspector.Cursor) {
	fd := fdc.Node().(*ast.FuncDecl)
	c.addParams(fd, fd.Recv, fd.Type)
	for cur := range fdc.Preorder((*ast.FuncLit)(nil), (*ast.AssignStmt)(nil), (*ast.IncDecStmt)(nil), (*ast.ValueSpec)(nil), (*ast.RangeStmt)(nil)) {
		// Type switches and select cases (case x := <-ch) bind values
		// that are not traced: such variables have no definition.
		switch n := cur.Node().(type) {
		case *ast.FuncLit:
			c.addParams(n, nil, n.Type)
		case *ast.AssignStmt:
			switch {
			case n.Tok != token.ASSIGN && n.Tok != token.DEFINE:
				for _, l := range n.Lhs {
					c.addDef(l, def{pos: n.Pos(), kind: defCounter})
				}
			case len(n.Lhs) == len(n.Rhs):
				for i, l := range n.Lhs {
					c.addDef(l, def{pos: n.Rhs[i].Pos(), rhs: n.Rhs[i]})
				}
			case len(n.Rhs) == 1:
				for _, l := range n.Lhs {
					c.addDef(l, def{pos: n.Rhs[0].Pos(), rhs: n.Rhs[0]})
				}
			}
		case *ast.IncDecStmt:
			c.addDef(n.X, def{pos: n.Pos(), kind: defCounter})
		case *ast.ValueSpec:
			for i, name := range n.Names {
				switch {
				case len(n.Values) == len(n.Names):
					c.addDef(name, def{pos: n.Values[i].Pos(), rhs: n.Values[i]})
				case len(n.Values) == 1:
					c.addDef(name, def{pos: n.Values[0].Pos(), rhs: n.Values[0]})
				case len(n.Values) == 0:
					c.addDef(name, def{pos: name.Pos(), kind: defZero})
				}
			}
		case *ast.RangeStmt:
			for _, e := range []ast.Expr{n.Key, n.Value} {
				if e != nil {
					c.addDef(e, def{pos: n.Pos(), kind: defRange, loop: n})
				}
			}
		}
	}
}

type originKind int

const (
	oSource   originKind = iota // a call to a random source or the clock
	oCounter                    // a variable changed by ++ or op=
	oRangeVar                   // a range loop's key or value
	oParam                      // a parameter of a function or closure
	oPkgVar                     // a package-level variable
	oField                      // a struct field read
	oOpaque                     // something not traced further
)

type origin struct {
	kind originKind
	pos  token.Pos
	desc string     // what it is, for messages
	v    *types.Var // for oCounter, oRangeVar, oParam, oPkgVar
	sel  *ast.SelectorExpr
	loop ast.Node // for oRangeVar
}

// trace calls yield with everything e's value is computed from, following
// local variables through their assignments (every assignment, wherever it
// is). It stops at sources, parameters, package variables and field reads.
func (c *checker) trace(e ast.Expr, yield func(origin)) {
	c.traceSeen(e, map[*types.Var]bool{}, yield)
}

func (c *checker) traceSeen(e ast.Expr, seen map[*types.Var]bool, yield func(origin)) {
	if e == nil {
		return
	}
	info := c.pass.TypesInfo
	if tv, ok := info.Types[e]; ok && tv.Value != nil {
		return // constant
	}
	switch e := e.(type) {
	case *ast.Ident:
		obj := info.ObjectOf(e)
		v, ok := obj.(*types.Var)
		if !ok {
			return
		}
		if v.Pkg() != nil && v.Parent() == v.Pkg().Scope() {
			yield(origin{kind: oPkgVar, pos: v.Pos(), v: v, desc: "package variable " + v.Name()})
			return
		}
		if seen[v] {
			return
		}
		seen[v] = true
		if _, ok := c.params[v]; ok {
			yield(origin{kind: oParam, pos: v.Pos(), v: v, desc: v.Name()})
		}
		ds := c.defs[v]
		if _, ok := c.params[v]; !ok && len(ds) == 0 {
			yield(origin{kind: oOpaque, pos: v.Pos(), v: v, desc: v.Name()})
		}
		for _, d := range ds {
			switch d.kind {
			case defCounter:
				yield(origin{kind: oCounter, pos: d.pos, v: v, desc: "the counter " + v.Name()})
			case defRange:
				yield(origin{kind: oRangeVar, pos: d.pos, v: v, loop: d.loop, desc: v.Name()})
			case defZero:
				yield(origin{kind: oOpaque, pos: d.pos, v: v, desc: v.Name()})
			default:
				c.traceSeen(d.rhs, seen, yield)
			}
		}
	case *ast.SelectorExpr:
		if sel, ok := info.Selections[e]; ok {
			if sel.Kind() == types.FieldVal {
				if src, pos := c.freshField(e); src != "" {
					yield(origin{kind: oSource, pos: pos, desc: src})
					return
				}
				yield(origin{kind: oField, pos: e.Pos(), sel: e, desc: types.ExprString(e)})
				return
			}
			c.traceSeen(e.X, seen, yield) // method value
			return
		}
		// A qualified identifier: pkg.Var.
		c.traceSeen(e.Sel, seen, yield)
	case *ast.CallExpr:
		if isAtomicAdd(c.pass.TypesInfo, e) {
			// seq.Add(1): a counter, new on every call like a local
			// counter++ (and like it, the same sequence on every run).
			yield(origin{kind: oCounter, pos: e.Pos(), desc: "the atomic counter " + types.ExprString(e)})
			return
		}
		if src := c.sourceName(e); src != "" {
			yield(origin{kind: oSource, pos: e.Pos(), desc: src})
			return
		}
		if tv, ok := info.Types[e.Fun]; ok && tv.IsType() {
			for _, a := range e.Args { // conversion
				c.traceSeen(a, seen, yield)
			}
			return
		}
		if !c.pureCall(e) {
			// A call whose result may differ between two calls with the
			// same arguments (a method reading state, a lookup).
			yield(origin{kind: oOpaque, pos: e.Pos(), desc: types.ExprString(e.Fun)})
		}
		args := yield
		switch f := ast.Unparen(e.Fun).(type) {
		case *ast.SelectorExpr:
			if sel, ok := info.Selections[f]; ok {
				c.traceSeen(f.X, seen, yield)
				if sel.Kind() == types.MethodVal && !c.pureCall(e) {
					// store.Reserve(id, uuid.NewString()): a method that
					// reads state may return a saved value rather than
					// the new one it is given.
					args = func(o origin) {
						if o.kind == oSource {
							o.kind = oOpaque
						}
						yield(o)
					}
				}
			}
		case *ast.FuncLit:
			return
		}
		for _, a := range e.Args {
			c.traceSeen(a, seen, args)
		}
	case *ast.FuncLit:
		return
	case *ast.KeyValueExpr:
		c.traceSeen(e.Value, seen, yield)
	case *ast.CompositeLit:
		for _, el := range e.Elts {
			if kv, ok := el.(*ast.KeyValueExpr); ok {
				el = kv.Value
			}
			c.traceSeen(el, seen, yield)
		}
	default:
		ast.Inspect(e, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncLit:
				return false
			case ast.Expr:
				if n != e {
					switch n.(type) {
					case *ast.Ident, *ast.SelectorExpr, *ast.CallExpr, *ast.CompositeLit:
						c.traceSeen(n, seen, yield)
						return false
					}
				}
			}
			return true
		})
	}
}

var sourceFuncs = map[string]map[string]bool{
	"crypto/rand": {"Read": true, "Text": true, "Int": true, "Prime": true},
	"time":        {"Now": true, "Since": true},
	"github.com/google/uuid": {"New": true, "NewString": true, "NewRandom": true, "NewUUID": true,
		"NewV6": true, "NewV7": true, "NewRandomFromReader": true, "Must": true},
	"github.com/segmentio/ksuid":                 {"New": true, "NewRandom": true},
	"github.com/rs/xid":                          {"New": true},
	"github.com/lithammer/shortuuid":             {"New": true},
	"github.com/matoous/go-nanoid":               {"New": true, "Generate": true, "Must": true},
	"github.com/matoous/go-nanoid/v2":            {"New": true, "Generate": true, "Must": true},
	"github.com/jaevor/go-nanoid":                {"Standard": true},
	"github.com/hashicorp/go-uuid":               {"GenerateUUID": true},
	"github.com/pborman/uuid":                    {"New": true, "NewRandom": true, "NewUUID": true},
	"github.com/twinj/uuid":                      {"NewV4": true, "NewV1": true},
	"github.com/oklog/ulid":                      {"Make": true, "New": true, "MustNew": true},
	"github.com/oklog/ulid/v2":                   {"Make": true, "New": true, "MustNew": true},
	"github.com/teris-io/shortid":                {"Generate": true, "MustGenerate": true},
	"github.com/gofrs/uuid":                      {"NewV1": true, "NewV4": true, "NewV6": true, "NewV7": true, "Must": true},
	"github.com/gofrs/uuid/v5":                   {"NewV1": true, "NewV4": true, "NewV6": true, "NewV7": true, "Must": true},
	"github.com/satori/go.uuid":                  {"NewV1": true, "NewV4": true, "Must": true},
	"github.com/bwmarrin/snowflake":              {"Generate": true},
	"github.com/sony/sonyflake":                  {"NextID": true},
	"github.com/sony/sonyflake/v2":               {"NextID": true},
	"go.mongodb.org/mongo-driver/bson/primitive": {"NewObjectID": true},
}

// sourceName returns a description of the call if it returns a new value
// every time it is called: a random number or id, the clock, or a function
// of this program that returns one of those.
func (c *checker) sourceName(call *ast.CallExpr) string {
	fn, ok := typeutil.Callee(c.pass.TypesInfo, call).(*types.Func)
	if !ok || fn.Pkg() == nil {
		return ""
	}
	path, name := fn.Pkg().Path(), fn.Name()
	recv := fn.Type().(*types.Signature).Recv()
	switch {
	case path == "math/rand" || path == "math/rand/v2":
		if recv != nil || !strings.HasPrefix(name, "New") {
			return shortName(fn) + "()"
		}
		return ""
	case sourceFuncs[path][name]: // functions, and generators' methods (node.Generate)
		if name == "Must" || name == "MustNew" {
			// uuid.Must(uuid.NewRandom()): the argument decides.
			for _, a := range call.Args {
				if inner, ok := ast.Unparen(a).(*ast.CallExpr); ok {
					if s := c.sourceName(inner); s != "" {
						return s
					}
				}
			}
			if name == "Must" {
				return ""
			}
		}
		return shortName(fn) + "()"
	}
	if s, ok := c.fresh[fn]; ok {
		return shortName(fn) + "() (which returns " + s + ")"
	}
	var f freshResult
	if c.pass.ImportObjectFact(fn, &f) {
		return shortName(fn) + "() (which returns " + f.Source + ")"
	}
	return ""
}

// isAtomicAdd reports whether call adds to a sync/atomic counter:
// n.Add(1), atomic.AddInt64(&n, 1).
func isAtomicAdd(info *types.Info, call *ast.CallExpr) bool {
	fn, ok := typeutil.Callee(info, call).(*types.Func)
	return ok && fn.Pkg() != nil && fn.Pkg().Path() == "sync/atomic" && strings.HasPrefix(fn.Name(), "Add")
}

// purePkgs hold functions whose result depends only on their arguments.
var purePkgs = map[string]bool{
	"fmt": true, "strings": true, "strconv": true, "encoding/hex": true, "encoding/base64": true,
	"crypto/sha256": true, "crypto/sha1": true, "crypto/sha512": true, "crypto/md5": true,
	"path": true, "net/url": true, "hash/fnv": true, "encoding/binary": true, "bytes": true,
	"github.com/billonce/billonce/idemkey": true,
}

func (c *checker) pureCall(call *ast.CallExpr) bool {
	obj := typeutil.Callee(c.pass.TypesInfo, call)
	if b, ok := obj.(*types.Builtin); ok {
		return b.Name() == "len" || b.Name() == "string" || b.Name() == "append"
	}
	fn, ok := obj.(*types.Func)
	if !ok || fn.Pkg() == nil {
		return false
	}
	path := fn.Pkg().Path()
	if purePkgs[path] || stripeRoot.MatchString(path) {
		return true
	}
	// Methods that format a value: key.String(), id.Hex().
	switch fn.Name() {
	case "String", "Hex", "Format", "Sprintf", "Error":
		return true
	}
	return false
}
