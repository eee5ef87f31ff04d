package idemvet

import (
	"go/ast"
	"go/types"

	"golang.org/x/tools/go/ast/inspector"
)

// expand replaces each field read by the origins of its base, keeping the
// field read itself.
func (c *checker) expand(origins []origin) []origin {
	var out []origin
	var add func(o origin, depth int)
	add = func(o origin, depth int) {
		out = append(out, o)
		if o.kind == oField && depth < 4 {
			// c.cfg.Key: c.cfg, then c.
			c.trace(o.sel.X, func(b origin) { add(b, depth+1) })
		}
	}
	for _, o := range origins {
		add(o, 0)
	}
	return out
}

// customerOf returns the values the request gives its Customer field.
func customerOf(request []ast.Expr) []ast.Expr {
	var out []ast.Expr
	for _, r := range request {
		ast.Inspect(r, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncLit:
				return false
			case *ast.KeyValueExpr:
				if id, ok := n.Key.(*ast.Ident); ok && id.Name == "Customer" {
					out = append(out, n.Value)
				}
			}
			return true
		})
	}
	return out
}

// perOperation reports whether recv, whose field the key is read from, is
// built per operation rather than once for many: the request's customer
// comes from recv too, or recv's type is built with its key field made
// from a value that also fills another field (&op{customer: c, key:
// "charge:" + c + ":" + period}). A customer given as a parameter of fd
// says recv serves many customers.
func (c *checker) perOperation(fd *ast.FuncDecl, recv *types.Var, s sink, keyOrigins []origin) bool {
	fromRecv := false
	for _, e := range customerOf(s.request) {
		var os []origin
		c.trace(e, func(o origin) { os = append(os, o) })
		for _, o := range c.expand(os) {
			switch {
			case o.kind == oParam && o.v == recv:
				fromRecv = true
			case o.kind == oParam && c.params[o.v] == fd:
				return false
			}
		}
	}
	if fromRecv {
		return true
	}
	fields := map[string]bool{}
	for _, o := range keyOrigins {
		if o.kind == oField {
			if id, ok := ast.Unparen(o.sel.X).(*ast.Ident); ok && c.pass.TypesInfo.Uses[id] == recv {
				fields[o.sel.Sel.Name] = true
			}
		}
	}
	t := recv.Type()
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	paramsOf := func(e ast.Expr) map[*types.Var]bool {
		ps := map[*types.Var]bool{}
		c.trace(e, func(o origin) {
			if (o.kind == oParam || o.kind == oRangeVar) && !isContext(o.v.Type()) {
				ps[o.v] = true
			}
		})
		return ps
	}
	for cur := range c.insp.Root().Preorder((*ast.CompositeLit)(nil)) {
		lit := cur.Node().(*ast.CompositeLit)
		if !types.Identical(c.pass.TypesInfo.TypeOf(lit), t) {
			continue
		}
		var keyPs []map[*types.Var]bool
		others := map[*types.Var]bool{}
		for _, el := range lit.Elts {
			kv, ok := el.(*ast.KeyValueExpr)
			if !ok {
				continue
			}
			id, ok := kv.Key.(*ast.Ident)
			if !ok {
				continue
			}
			if fields[id.Name] {
				keyPs = append(keyPs, paramsOf(kv.Value))
			} else {
				for v := range paramsOf(kv.Value) {
					others[v] = true
				}
			}
		}
		for _, ps := range keyPs {
			for v := range ps {
				if others[v] {
					return true
				}
			}
		}
	}
	return false
}

// checkFixedKey reports one key sent for many operations: invariant across
// a range loop whose request changes, or read from the receiver or a
// package variable in a function whose parameters name the operation.
func (c *checker) checkFixedKey(fdc inspector.Cursor, s sink, origins []origin) {
	fd := fdc.Node().(*ast.FuncDecl)
	// A field read's base counts: a key field of a value built before the
	// loop is fixed for the loop, whatever the value was built from.
	all := c.expand(origins)
	var reqOrigins []origin
	for _, r := range s.request {
		c.trace(r, func(o origin) { reqOrigins = append(reqOrigins, o) })
	}
	reqOrigins = c.expand(reqOrigins)

	// A range loop over a collection: the key must change with the element.
	for e := range s.cur.Enclosing((*ast.RangeStmt)(nil)) {
		rs := e.Node().(*ast.RangeStmt)
		if t, ok := c.pass.TypesInfo.TypeOf(rs.X).Underlying().(*types.Basic); ok && t.Info()&types.IsInteger != 0 {
			continue
		}
		inLoop := func(o origin) bool {
			return (o.kind == oRangeVar && o.loop == rs) || (o.pos >= rs.Body.Pos() && o.pos < rs.Body.End())
		}
		invariant := true
		for _, o := range all {
			if inLoop(o) && o.kind != oField || o.kind == oSource && inLoop(o) {
				invariant = false
			}
		}
		varies := false
		for _, o := range reqOrigins {
			if o.kind == oRangeVar && o.loop == rs {
				varies = true
			}
		}
		if tv, ok := c.pass.TypesInfo.Types[s.key]; ok && tv.Value != nil {
			break // a literal key ("k"): a fixture, each pass usually aimed at its own server
		}
		if invariant && varies {
			c.report(s.cur, FixedKey,
				"the same idempotency key %s is sent for every element of the range loop at line %d while the rest of the request changes: Stripe runs the first request only and answers every later one with its result or an idempotency_error, so only the first is charged. "+
					"Make the key inside the loop from what identifies each operation (customer, period: idemkey.For)",
				keyText(s.key), c.pass.Fset.Position(rs.Pos()).Line)
			return
		}
		break
	}

	// A key read from the receiver or a package variable, in a function
	// whose parameters say which operation it is.
	for _, o := range origins {
		if o.kind == oSource || o.kind == oCounter {
			return // the key itself changes per call: not fixed
		}
	}
	var recv *types.Var
	if fd.Recv != nil && len(fd.Recv.List) > 0 && len(fd.Recv.List[0].Names) > 0 {
		recv, _ = c.pass.TypesInfo.Defs[fd.Recv.List[0].Names[0]].(*types.Var)
	}
	fromRecv, fromPkg := false, false
	for _, o := range all {
		switch {
		case o.kind == oField, o.kind == oSource:
		case o.kind == oPkgVar:
			fromPkg = true
		case o.kind == oParam && recv != nil && o.v == recv:
			fromRecv = true
		default:
			return // depends on something that may change per call
		}
	}
	if !fromRecv && !fromPkg {
		return
	}
	var varying *types.Var
	for _, o := range reqOrigins {
		if o.kind == oParam && o.v != recv && !isContext(o.v.Type()) && c.params[o.v] == fd {
			varying = o.v
			break
		}
	}
	if varying == nil || fromRecv && c.perOperation(fd, recv, s, all) {
		return
	}
	where := "a package variable, set once per process"
	if fromRecv {
		where = "a field of " + recv.Name() + ", set once when it was built"
	}
	c.report(s.cur, FixedKey,
		"idempotency key %s is %s, so every call of %s sends the same key whatever %s it is given: Stripe runs the first request only and answers every later one with its result or an idempotency_error. "+
			"Make the key per operation from its identity (%s, period: idemkey.For)",
		keyText(s.key), where, fd.Name.Name, varying.Name(), varying.Name())
}

func keyText(e ast.Expr) string {
	if call, ok := e.(*ast.CallExpr); ok && len(call.Args) == 1 {
		if sel, ok := call.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "String" {
			e = call.Args[0] // stripe.String(k)
		}
	}
	return types.ExprString(e)
}
