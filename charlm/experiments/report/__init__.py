"""Reading runs back for comparisons (compare), writing tables and the index (write), plots (figures)."""
