package idemvet

import (
	"go/ast"
	"go/constant"
	"go/types"
	"regexp"
	"strings"

	"golang.org/x/tools/go/ast/edge"
	"golang.org/x/tools/go/ast/inspector"
	"golang.org/x/tools/go/types/typeutil"
)

// A sink is a place where a value becomes an idempotency key.
type sink struct {
	cur     inspector.Cursor // the key expression, reported here
	key     ast.Expr
	request []ast.Expr // the other parts of the same request
}

// checkKeys runs the key rules on every key set in the function declared
// at fdc. A key gets one report: retrykey first, then freshkey, then
// fixedkey.
func (c *checker) checkKeys(fdc inspector.Cursor) {
	for _, s := range c.sinks(fdc) {
		var origins []origin
		c.trace(s.key, func(o origin) { origins = append(origins, o) })
		bs := c.retries(s, c.boundaries(s.cur))
		if c.checkRetryKey(s, origins, bs) || c.checkFreshKey(s, origins, bs) {
			continue
		}
		c.checkFixedKey(fdc, s, origins)
	}
}

// sinks returns every place in the function declared at fdc where a value
// becomes an idempotency key: a field named IdempotencyKey,
// SetIdempotencyKey, an Idempotency-Key header, or an argument of a
// function known to turn that argument into a key.
func (c *checker) sinks(fdc inspector.Cursor) []sink {
	info := c.pass.TypesInfo
	var out []sink
	add := func(cur inspector.Cursor, request []ast.Expr) {
		out = append(out, sink{cur: cur, key: cur.Node().(ast.Expr), request: request})
	}
	outer := map[*ast.CompositeLit]*ast.CompositeLit{}
	for cur := range bodyOf(fdc).Preorder((*ast.AssignStmt)(nil), (*ast.CompositeLit)(nil), (*ast.CallExpr)(nil)) {
		switch n := cur.Node().(type) {
		case *ast.AssignStmt:
			if len(n.Lhs) != len(n.Rhs) {
				continue
			}
			for i, l := range n.Lhs {
				switch l := ast.Unparen(l).(type) {
				case *ast.SelectorExpr:
					if isKeyField(info, l) {
						add(cur.ChildAt(edge.AssignStmt_Rhs, i), c.requestOf(fdc, l.X))
					}
				case *ast.IndexExpr: // req.Header["Idempotency-Key"] = []string{k}
					if isHeader(info.TypeOf(l.X)) && isKeyHeaderName(info, l.Index) {
						add(cur.ChildAt(edge.AssignStmt_Rhs, i), c.requestOf(fdc, l.X))
					}
				}
			}
		case *ast.CompositeLit:
			value := func(i int) inspector.Cursor {
				return cur.ChildAt(edge.CompositeLit_Elts, i).ChildAt(edge.KeyValueExpr_Value, -1)
			}
			// http.Header{"Idempotency-Key": {k}}, map[string]string{...}
			// handed to a client's SetHeaders.
			if _, ok := info.TypeOf(n).Underlying().(*types.Map); ok {
				for i, el := range n.Elts {
					if kv, ok := el.(*ast.KeyValueExpr); ok && isKeyHeaderName(info, kv.Key) {
						add(value(i), nil)
					}
				}
				continue
			}
			// &XParams{Params: stripe.Params{IdempotencyKey: k}, Customer: c}:
			// the request is both literals' other fields.
			for _, el := range n.Elts {
				if kv, ok := el.(*ast.KeyValueExpr); ok {
					if inner, ok := ast.Unparen(kv.Value).(*ast.CompositeLit); ok {
						outer[inner] = n
					}
				}
			}
			for i, el := range n.Elts {
				kv, ok := el.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				if id, ok := kv.Key.(*ast.Ident); ok && id.Name == "IdempotencyKey" {
					if v, ok := info.ObjectOf(id).(*types.Var); ok && v.IsField() {
						var req []ast.Expr
						for lit, skip := n, el; lit != nil; lit, skip = outer[lit], nil {
							for _, other := range lit.Elts {
								if other != el && other != skip {
									req = append(req, other)
								}
							}
						}
						add(value(i), req)
					}
				}
			}
		case *ast.CallExpr:
			fn, _ := typeutil.Callee(info, n).(*types.Func)
			if fn == nil {
				continue
			}
			arg := func(i int) inspector.Cursor { return cur.ChildAt(edge.CallExpr_Args, i) }
			sel, _ := ast.Unparen(n.Fun).(*ast.SelectorExpr)
			switch {
			case fn.Name() == "SetIdempotencyKey" && len(n.Args) == 1 && sel != nil:
				add(arg(0), c.requestOf(fdc, sel.X))
			case headerSetter.MatchString(fn.Name()) && len(n.Args) == 2 && sel != nil && isKeyHeaderName(info, n.Args[0]):
				// http.Header's Set and Add, resty's SetHeader, ...
				add(arg(1), c.requestOf(fdc, sel.X))
			default:
				for _, i := range c.keyParamsOf(fn) {
					if i < len(n.Args) {
						var req []ast.Expr
						for j, a := range n.Args {
							if j != i {
								req = append(req, a)
							}
						}
						add(arg(i), req)
					}
				}
			}
		}
	}
	return out
}

var headerSetter = regexp.MustCompile(`^(Set|Add)(Header)?$`)

func isKeyField(info *types.Info, sel *ast.SelectorExpr) bool {
	s, ok := info.Selections[sel]
	return ok && s.Kind() == types.FieldVal && sel.Sel.Name == "IdempotencyKey"
}

func isHeader(t types.Type) bool {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	n, ok := t.(*types.Named)
	return ok && n.Obj().Pkg() != nil && n.Obj().Pkg().Path() == "net/http" && n.Obj().Name() == "Header"
}

func isKeyHeaderName(info *types.Info, e ast.Expr) bool {
	tv, ok := info.Types[e]
	return ok && tv.Value != nil && tv.Value.Kind() == constant.String &&
		strings.EqualFold(constant.StringVal(tv.Value), "Idempotency-Key")
}

// requestOf returns what else goes into the request whose key is set on x
// (params.IdempotencyKey, req.Header): the values x was built from and
// the values assigned to its other fields in the function at fdc.
func (c *checker) requestOf(fdc inspector.Cursor, x ast.Expr) []ast.Expr {
	root := rootIdent(x)
	if root == nil {
		return nil
	}
	v := c.localVar(root)
	if v == nil {
		return []ast.Expr{x}
	}
	var out []ast.Expr
	for _, d := range c.defs[v] {
		if d.rhs != nil {
			out = append(out, d.rhs)
		}
	}
	if _, ok := c.params[v]; ok {
		out = append(out, root)
	}
	for cur := range bodyOf(fdc).Preorder((*ast.AssignStmt)(nil)) {
		as := cur.Node().(*ast.AssignStmt)
		if len(as.Lhs) != len(as.Rhs) {
			continue
		}
		for i, l := range as.Lhs {
			if sel, ok := l.(*ast.SelectorExpr); ok && sel.Sel.Name != "IdempotencyKey" {
				if r := rootIdent(sel.X); r != nil && c.pass.TypesInfo.ObjectOf(r) == v {
					// Field: value, as in a literal, so the field's name
					// is kept (see customerOf).
					out = append(out, &ast.KeyValueExpr{Key: sel.Sel, Colon: as.Rhs[i].Pos(), Value: as.Rhs[i]})
				}
			}
		}
	}
	return out
}
