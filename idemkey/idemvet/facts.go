package idemvet

import (
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"slices"

	"golang.org/x/tools/go/ast/inspector"
	"golang.org/x/tools/go/types/typeutil"
)

// This file holds what the analysis of one package tells the packages that
// import it: its helpers that turn an argument into a key, return a new
// value per call, or build Stripe params without a key.

// keyParams marks a function whose parameters at these indexes end up as
// an idempotency key (a helper that builds Stripe params from a key, for
// instance). A call's argument at such an index is checked as a key.
type keyParams struct{ Index []int }

func (*keyParams) AFact()           {}
func (f *keyParams) String() string { return "keyParams" }

// freshResult marks a function whose result is made from a random source
// or the clock: a new value on every call.
type freshResult struct{ Source string }

func (*freshResult) AFact()           {}
func (f *freshResult) String() string { return "freshResult(" + f.Source + ")" }

// freshFields marks a function returning a struct (or a pointer to one)
// whose fields at these names are made from a random source or the clock.
type freshFields struct{ Source map[string]string }

func (*freshFields) AFact()           {}
func (f *freshFields) String() string { return fmt.Sprintf("freshFields(%v)", f.Source) }

// keylessResult marks a function whose first result is Stripe params that
// are sure to carry no idempotency key: every return builds them afresh
// without one (or returns nil).
type keylessResult struct{}

func (*keylessResult) AFact()         {}
func (*keylessResult) String() string { return "keylessResult" }

// checker holds what run learns about one package.

func (c *checker) keyParamsOf(fn *types.Func) []int {
	if idx, ok := c.keyParam[fn]; ok {
		return idx
	}
	if fn.Pkg() == c.pass.Pkg {
		return nil
	}
	var f keyParams
	if c.pass.ImportObjectFact(fn.Origin(), &f) {
		return f.Index
	}
	return nil
}

// computeFacts finds, to a fixed point, the functions of this package that
// turn a parameter into a key, and those that return a new value per call.
func (c *checker) computeFacts() {
	for range 5 {
		changed := false
		for fn, fdc := range c.decls {
			var params []*types.Var
			sig := fn.Type().(*types.Signature)
			for i := range sig.Params().Len() {
				params = append(params, sig.Params().At(i))
			}
			// A parameter that is the key by itself (possibly converted or
			// formatted), not one part of a key made from several.
			var idx []int
			for _, s := range c.sinks(fdc) {
				only := -1
				c.trace(s.key, func(o origin) {
					i := -2
					if o.kind == oParam {
						i = slices.Index(params, o.v)
					}
					switch {
					case only == -1 && i >= 0:
						only = i
					case i != only:
						only = -2
					}
				})
				if only >= 0 && !slices.Contains(idx, only) {
					idx = append(idx, only)
				}
			}
			slices.Sort(idx)
			if len(idx) > 0 && !slices.Equal(idx, c.keyParam[fn]) {
				c.keyParam[fn] = idx
				changed = true
			}
			if _, done := c.freshFld[fn]; !done && returnsStruct(sig) {
				if m := c.freshFieldsOf(fdc); len(m) > 0 {
					c.freshFld[fn] = m
					changed = true
				}
			}
			if !c.keyless[fn] && returnsParams(sig) && c.returnsKeyless(fdc) {
				c.keyless[fn] = true
				changed = true
			}
			if _, done := c.fresh[fn]; !done && returnsIDLike(sig) {
				if src := c.freshReturn(fdc); src != "" {
					c.fresh[fn] = src
					changed = true
				}
			}
		}
		if !changed {
			break
		}
	}
	// Only exported functions can be called from other packages.
	for fn, idx := range c.keyParam {
		if fn.Exported() {
			c.pass.ExportObjectFact(fn, &keyParams{Index: idx})
		}
	}
	for fn := range c.keyless {
		if fn.Exported() {
			c.pass.ExportObjectFact(fn, &keylessResult{})
		}
	}
	for fn, src := range c.fresh {
		if fn.Exported() {
			c.pass.ExportObjectFact(fn, &freshResult{Source: src})
		}
	}
	for fn, m := range c.freshFld {
		// Other packages can read only exported fields.
		exp := map[string]string{}
		for f, src := range m {
			if token.IsExported(f) {
				exp[f] = src
			}
		}
		if fn.Exported() && len(exp) > 0 {
			c.pass.ExportObjectFact(fn, &freshFields{Source: exp})
		}
	}
}

func returnsStruct(sig *types.Signature) bool {
	if sig.Results().Len() == 0 {
		return false
	}
	t := sig.Results().At(0).Type()
	if p, ok := t.Underlying().(*types.Pointer); ok {
		t = p.Elem()
	}
	_, ok := t.Underlying().(*types.Struct)
	return ok
}

// freshFieldsOf returns the fields of the struct the function at fdc
// returns that are made from a random source or the clock:
// return T{Key: uuid.NewString()}.
func (c *checker) freshFieldsOf(fdc inspector.Cursor) map[string]string {
	var m map[string]string
	for _, cur := range returnsOf(fdc) {
		ret := cur.Node().(*ast.ReturnStmt)
		if len(ret.Results) == 0 {
			continue
		}
		r := ast.Unparen(ret.Results[0])
		if u, ok := r.(*ast.UnaryExpr); ok && u.Op == token.AND {
			r = ast.Unparen(u.X)
		}
		lit, ok := r.(*ast.CompositeLit)
		if !ok {
			continue
		}
		for _, el := range lit.Elts {
			kv, ok := el.(*ast.KeyValueExpr)
			if !ok {
				continue
			}
			id, ok := kv.Key.(*ast.Ident)
			if !ok {
				continue
			}
			c.trace(kv.Value, func(o origin) {
				if o.kind == oSource {
					if m == nil {
						m = map[string]string{}
					}
					if m[id.Name] == "" {
						m[id.Name] = o.desc
					}
				}
			})
		}
	}
	return m
}

// freshField reports whether the field read sel is a field made from a
// random source by the function that built its struct: op.Key after
// op := NewOp(...). It returns a description and where the call is.
func (c *checker) freshField(sel *ast.SelectorExpr) (string, token.Pos) {
	var calls []*ast.CallExpr
	switch x := ast.Unparen(sel.X).(type) {
	case *ast.CallExpr:
		calls = append(calls, x)
	case *ast.Ident:
		if v := c.localVar(x); v != nil {
			for _, d := range c.defs[v] {
				if call, ok := ast.Unparen(d.rhs).(*ast.CallExpr); ok {
					calls = append(calls, call)
				}
			}
		}
	}
	for _, call := range calls {
		fn, ok := typeutil.Callee(c.pass.TypesInfo, call).(*types.Func)
		if !ok || fn.Pkg() == nil {
			continue
		}
		m := c.freshFld[fn]
		if m == nil && fn.Pkg() != c.pass.Pkg {
			var f freshFields
			if c.pass.ImportObjectFact(fn.Origin(), &f) {
				m = f.Source
			}
		}
		if src := m[sel.Sel.Name]; src != "" {
			return shortName(fn) + "() (which returns " + src + " in " + sel.Sel.Name + ")", call.Pos()
		}
	}
	return "", token.NoPos
}

// returnsIDLike reports whether the first result could be an id or key:
// a string, a number, bytes or an array (a UUID), not a struct.
func returnsIDLike(sig *types.Signature) bool {
	if sig.Results().Len() == 0 {
		return false
	}
	switch u := sig.Results().At(0).Type().Underlying().(type) {
	case *types.Basic:
		return u.Info()&(types.IsString|types.IsInteger) != 0
	case *types.Array:
		return true
	case *types.Slice:
		b, ok := u.Elem().Underlying().(*types.Basic)
		return ok && b.Kind() == types.Byte
	}
	return false
}

// freshReturn describes the random source or clock the function at fdc
// returns a value from, or returns "".
func (c *checker) freshReturn(fdc inspector.Cursor) string {
	src := ""
	for _, cur := range returnsOf(fdc) {
		ret := cur.Node().(*ast.ReturnStmt)
		if len(ret.Results) > 0 && src == "" {
			c.trace(ret.Results[0], func(o origin) {
				if o.kind == oSource && src == "" {
					src = o.desc
				}
			})
		}
	}
	return src
}
