package idemvet

import (
	"go/ast"
	"go/token"
	"go/types"

	"golang.org/x/tools/go/ast/edge"
	"golang.org/x/tools/go/ast/inspector"
)

// bodyOf returns the body of the function declaration at fdc.
func bodyOf(fdc inspector.Cursor) inspector.Cursor {
	return fdc.ChildAt(edge.FuncDecl_Body, -1)
}

func within(n ast.Node, pos token.Pos) bool { return n.Pos() <= pos && pos < n.End() }

func isNil(e ast.Expr) bool {
	id, ok := ast.Unparen(e).(*ast.Ident)
	return ok && id.Name == "nil"
}

func isContext(t types.Type) bool {
	return types.TypeString(t, nil) == "context.Context"
}

// shortName names fn for messages: pkg.F or T.M.
func shortName(fn *types.Func) string {
	if sig := fn.Type().(*types.Signature); sig.Recv() != nil {
		t := sig.Recv().Type()
		if p, ok := t.(*types.Pointer); ok {
			t = p.Elem()
		}
		if n, ok := t.(*types.Named); ok {
			return n.Obj().Name() + "." + fn.Name()
		}
		return fn.Name()
	}
	return fn.Pkg().Name() + "." + fn.Name()
}

func rootIdent(e ast.Expr) *ast.Ident {
	for {
		switch x := ast.Unparen(e).(type) {
		case *ast.Ident:
			return x
		case *ast.SelectorExpr:
			e = x.X
		case *ast.StarExpr:
			e = x.X
		case *ast.UnaryExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		default:
			return nil
		}
	}
}

// returnsOf returns the return statements of the function declared at
// fdc, leaving out those of its function literals.
func returnsOf(fdc inspector.Cursor) []inspector.Cursor {
	var out []inspector.Cursor
	bodyOf(fdc).Inspect([]ast.Node{(*ast.FuncLit)(nil), (*ast.ReturnStmt)(nil)}, func(cur inspector.Cursor) bool {
		if _, ok := cur.Node().(*ast.FuncLit); ok {
			return false
		}
		out = append(out, cur)
		return true
	})
	return out
}
