/* libdstage.so is made from the static archive (see CMakeLists.txt). */
