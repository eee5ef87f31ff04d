package lock

// MaxNameLen is the name limit, for the tests of package lock_test.
const MaxNameLen = maxNameLen
