package idemvet

import (
	"go/ast"
	"go/constant"
	"go/token"
	"go/types"
	"regexp"
	"strings"

	"golang.org/x/tools/go/ast/inspector"
	"golang.org/x/tools/go/types/typeutil"
)

// This file reports advisory locks taken or released through a connection
// pool: session locks (poollock) and transaction locks outside a
// transaction (xactlock).

var (
	sessionLock = regexp.MustCompile(`(?i)pg_(try_)?advisory_lock(_shared)?\s*\(`)
	unlock      = regexp.MustCompile(`(?i)pg_advisory_unlock(_shared|_all)?\s*\(`)
	xactLock    = regexp.MustCompile(`(?i)pg_(try_)?advisory_xact_lock(_shared)?\s*\(`)
	pgxpoolPath = regexp.MustCompile(`^github\.com/jackc/pgx(/v[0-9]+)?/pgxpool$`)
)

// poolType returns a name for t if it is a connection pool: statements
// sent through it may each run on a different session.
func poolType(t types.Type) string {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	n, ok := t.(*types.Named)
	if !ok || n.Obj().Pkg() == nil {
		return ""
	}
	path, name := n.Obj().Pkg().Path(), n.Obj().Name()
	switch {
	case pgxpoolPath.MatchString(path) && name == "Pool":
		return "*pgxpool.Pool"
	case path == "database/sql" && name == "DB":
		return "*sql.DB"
	case path == "github.com/jmoiron/sqlx" && name == "DB":
		return "*sqlx.DB"
	}
	return ""
}

func (c *checker) checkLocks(fdc inspector.Cursor) {
	info := c.pass.TypesInfo
	for cur := range bodyOf(fdc).Preorder((*ast.CallExpr)(nil)) {
		call := cur.Node().(*ast.CallExpr)
		sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr)
		if !ok {
			continue
		}
		pool := poolType(info.TypeOf(sel.X))
		if pool == "" {
			continue
		}
		sql := ""
		for _, a := range call.Args {
			if s, ok := c.constString(a); ok {
				sql = s
				break
			}
		}
		switch {
		case unlock.MatchString(sql) && sessionLock.MatchString(sql):
			// Locked and unlocked by one statement: one session, balanced.
		case unlock.MatchString(sql):
			c.report(cur, PoolLock,
				"pg_advisory_unlock sent through a %s runs on whichever pooled session is free, usually not the one holding the lock: it returns false, the lock stays held by a connection idling in the pool, and no other replica can take it. "+
					"Take and release the lock on one pinned connection (pool.Acquire / db.Conn) and unlock through that connection before releasing it",
				pool)
		case sessionLock.MatchString(sql):
			c.report(cur, PoolLock,
				"session advisory lock taken through a %s: the lock belongs to whichever pooled session ran the statement, and that connection goes back to the pool still holding it, so the unlock (through the pool) usually lands on another session and does nothing, and other code reusing the connection silently holds the lock too. "+
					"Pin one connection (pool.Acquire / db.Conn), lock and unlock on it, and release it after the unlock",
				pool)
		case xactLock.MatchString(sql):
			c.report(cur, XactLock,
				"transaction advisory lock taken through a %s outside a transaction: the statement is its own transaction, so the lock is released as soon as it returns and protects nothing after it. "+
					"Begin a transaction, take the lock with tx, and do the guarded work in that transaction",
				pool)
		}
	}
}

func (c *checker) constString(e ast.Expr) (string, bool) {
	if tv, ok := c.pass.TypesInfo.Types[e]; ok && tv.Value != nil && tv.Value.Kind() == constant.String {
		return constant.StringVal(tv.Value), true
	}
	switch x := ast.Unparen(e).(type) {
	case *ast.Ident:
		// The one value given to a local variable (var q string does not count).
		if v := c.localVar(x); v != nil {
			var rhs []ast.Expr
			for _, d := range c.defs[v] {
				if d.kind != defZero {
					rhs = append(rhs, d.rhs)
				}
			}
			if len(rhs) == 1 && rhs[0] != nil {
				return c.constString(rhs[0])
			}
		}
	case *ast.CallExpr:
		// fmt.Sprintf("SELECT pg_advisory_unlock(%d)", key): the format.
		if fn, ok := typeutil.Callee(c.pass.TypesInfo, x).(*types.Func); ok && fn.Pkg() != nil && fn.Pkg().Path() == "fmt" &&
			strings.HasPrefix(fn.Name(), "Sprint") && len(x.Args) > 0 {
			return c.constString(x.Args[0])
		}
	case *ast.BinaryExpr:
		// "SELECT pg_advisory_unlock(" + strconv.FormatInt(key, 10) + ")"
		if x.Op == token.ADD {
			l, lok := c.constString(x.X)
			r, rok := c.constString(x.Y)
			return l + "?" + r, lok || rok
		}
	}
	return "", false
}
