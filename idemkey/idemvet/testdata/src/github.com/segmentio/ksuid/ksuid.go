package ksuid

type KSUID [20]byte

func New() KSUID               { return KSUID{} }
func (k KSUID) String() string { return "" }
