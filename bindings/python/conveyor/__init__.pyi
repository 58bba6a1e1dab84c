# stubs: filled below
